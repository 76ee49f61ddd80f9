#!/usr/bin/python3
"""Lists the real recorded English speech that Debian packages ship, with its transcripts, as a
NeMo manifest for `speech import`: a test set of real voices, for reporting only (never train
or select a model on it).

    /usr/bin/python3 data/make_real_speech.py --out corpus/real
    build/apps/speech import --format nemo --in corpus/real/real.json --out corpus/real/real.tsv

Needs only the Python standard library and the packages it reads (`bash scripts/setup.sh
real-speech` installs them):
  - tuxpaint-stamps-default: Tux Paint's stamps, many with a recorded English description
    (<name>_desc.ogg, Ogg Vorbis at 44.1 kHz, "A dog.", "Two wild boars."), its text the first
    line of <name>.txt beside it (the lines after it are translations, "xx.utf8=..."); a
    recording without its text is left out and counted;
  - alsa-utils: the channel names speaker-test plays (/usr/share/sounds/alsa/Front_Left.wav,
    ...: "Front Left", 48 kHz), the text from the file name; Noise.wav is not speech.

Written to --out: real.json (one JSON object a line: id, audio_filepath (absolute), text,
source) and sources.txt (what was found where, and what was left out). The importer gives the
phones through the CMU dictionary and leaves out, with their file and line, utterances that
hold a word the dictionary lacks.
"""

import argparse
import json
import os
import sys

TUXPAINT_STAMPS = "/usr/share/tuxpaint/stamps"
ALSA_SOUNDS = "/usr/share/sounds/alsa"


class RealSpeechError(Exception):
    pass


def tuxpaint(root):
    """(id, path, text) of every English stamp description with its text; and the left out."""
    found, left_out = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith("_desc.ogg"):  # translations are <name>_desc_<lang>.ogg
                continue
            stem = name[:-len("_desc.ogg")]
            audio = os.path.join(dirpath, name)
            text_file = os.path.join(dirpath, stem + ".txt")
            try:
                with open(text_file, encoding="utf-8") as f:
                    text = f.readline().strip()
            except OSError as e:
                left_out.append("%s: no text (%s)" % (audio, e.strerror))
                continue
            if not text or ".utf8=" in text:
                left_out.append("%s: %s does not open with the English text" % (audio, text_file))
                continue
            rel = os.path.relpath(os.path.join(dirpath, stem), root).replace(os.sep, "-")
            found.append(("tuxpaint-" + rel, audio, text))
    return found, left_out


def alsa(root):
    found = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".wav") and name != "Noise.wav":
            stem = name[:-len(".wav")]
            found.append(("alsa-" + stem, os.path.join(root, name), stem.replace("_", " ")))
    return found, []


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--tuxpaint", default=TUXPAINT_STAMPS, help="Tux Paint's stamps folder")
    parser.add_argument("--alsa", default=ALSA_SOUNDS, help="ALSA's speaker-test sounds folder")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace real.json and sources.txt if --out holds them")
    args = parser.parse_args()
    for name in ("real.json", "sources.txt"):  # checked before anything is read or written
        path = os.path.join(args.out, name)
        if os.path.exists(path) and not args.overwrite:
            print("make_real_speech: error: %s exists: pass --overwrite to replace it" % path,
                  file=sys.stderr)
            return 1
    sources = [("tuxpaint-stamps-default", args.tuxpaint, tuxpaint),
               ("alsa-utils", args.alsa, alsa)]
    rows, report = [], []
    try:
        for package, root, find in sources:
            if not os.path.isdir(root):
                report.append("%s: %s is missing (install the package; `bash scripts/setup.sh "
                              "real-speech`)" % (package, root))
                continue
            found, left_out = find(root)
            report.append("%s: %d recordings with text in %s, %d left out"
                          % (package, len(found), root, len(left_out)))
            report += ["  left out: " + l for l in left_out]
            rows += [(uid, path, text, package) for uid, path, text in found]
        if not rows:
            raise RealSpeechError("no recordings found:\n  " + "\n  ".join(report))
        os.makedirs(args.out, exist_ok=True)
        manifest = os.path.join(args.out, "real.json")
        with open(manifest + ".tmp", "w", encoding="utf-8") as f:
            for uid, path, text, package in rows:
                f.write(json.dumps({"id": uid, "audio_filepath": os.path.abspath(path),
                                    "text": text, "source": package}) + "\n")
        os.replace(manifest + ".tmp", manifest)
        with open(os.path.join(args.out, "sources.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(report) + "\n")
    except (OSError, RealSpeechError) as e:
        print("make_real_speech: error: %s" % e, file=sys.stderr)
        return 1
    for line in report:
        print("make_real_speech: " + line, file=sys.stderr)
    print("make_real_speech: wrote %d utterances to %s" % (len(rows), manifest), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

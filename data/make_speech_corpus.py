#!/usr/bin/python3
"""Generates a synthetic English speech corpus with phone labels, for CTC phone recognition.

    /usr/bin/python3 data/make_speech_corpus.py --out DIR [--train N] [--dev N] [--test N]
                                                [--unseen N] [--seed S] [--jobs J] [--small]
                                                [--force]
    /usr/bin/python3 data/make_speech_corpus.py --check-phonemes N [--jobs J]

Needs only the Python standard library and Debian's espeak-ng, sox, flite, wordnet-base,
fortunes, and for the unseen-family test set festival with festvox-kallpc16k and
festvox-kdlpc16k (`bash scripts/setup.sh speech` installs them).

Text: the quoted usage examples of WordNet's glosses (/usr/share/wordnet/data.*) and prose
sentences of the fortune files (/usr/share/games/fortunes), cleaned and de-duplicated. The
sentence list is shuffled with the seed and cut into disjoint pools: 5% dev, 5% test, 90% train,
so no dev or test sentence ever occurs in training text. An utterance joins 1 to 4 sentences of
its split's pool (each used once before any is reused) to last 1 to 10 s, about 6 s on average
(sentences are dropped from an utterance that runs longer; a lone sentence that does is replaced
by a short one of the same pool).

Speakers: espeak-ng speakers combine one of its English accents (`espeak-ng --voices=en`, the
eight espeak-ng voices; the mbrola ones need extra data), a voice variant (`--voices=variant`:
m1-m8, f1-f5, klatt, whisper, croak and the named ones), a base pitch (-p 20..80) and a rate
(-s 140..200 words per minute). The variants are shuffled with the seed and 10% are kept for dev
and 10% for test: no dev or test voice occurs in training. Training has one speaker per 10
utterances (dev and test one per 25); half of its espeak-ng speakers speak through a perturbed
copy of their (training) variant, formant frequencies and pitch scaled by a random vocal-tract
factor (perturb_variant), which widens the range of voices that training covers. Training also
has flite speakers (voices rms and kal16 only, with a duration stretch and a pitch shift). Other
flite voices and festival's HTS voice are never used: they are kept for evaluation outside the
project.

Unseen family (--unseen N, 500 by default; 0: none): a second test set spoken by a synthesizer
family that nothing else in the corpus uses, festival's diphone voices kal_diphone
(festvox-kallpc16k) and ked_diphone (festvox-kdlpc16k), one speaker per 25 utterances, each with
a duration stretch and a pitch shift as flite's. Its text comes from the test pool, its
augmentation is drawn as every split's.

Labels: the phones the synthesizer says it speaks. espeak-ng prints its phonemes (-x --sep=" ",
stress marks ' and , before vowels); ESPEAK_TO_ARPABET maps every phoneme of its English tables
onto the 39 ARPAbet phones of CMUdict, which WSJ-style phone recognisers use (a vowel that carries
an r in the dictionary gets it: A@ -> AA R, as CMUdict spells `car` for every accent); pauses
and linking marks are dropped; within a word a second R right after R or ER (an accent that
prints the r of e@ separately, or a linking r- after 3) is one R. flite prints CMUdict phones
(-ps): ax -> AH, pau dropped; festival's Segment relation holds the same phone set (ix -> IH; an
R right after ER is dropped, as ked_diphone spells er r where the dictionary has ER). A
phoneme that is not in the tables stops the run with an error naming it, the voice and the
sentence.

Audio: espeak-ng writes 22050 Hz PCM16, flite 16 kHz; sox resamples to 16 kHz mono 16-bit
(`rate -h`) and augments: speed 0.9..1.1 (half of the utterances), reverb (30%), white, pink or
brown noise at 5..30 dB SNR (half; a random stretch of a 30 s noise bed made by sox), and a peak
level of -20..-1 dBFS. Every draw comes from random.Random seeded with (seed, split, index), and
sox runs without dither, so the same arguments give the same corpus, byte for byte, at any
--jobs.

Output in --out:
  wav/<split>/<id>.wav     16 kHz mono PCM16
  train.tsv dev.tsv test.tsv unseen.tsv
                           one utterance per line: id, wav path relative to the manifest,
                           duration in seconds, space-separated phone labels
  tokens.txt               <blank> then the 39 phones (CTC output index = line - 1)
  speakers.tsv             speaker id, split, synthesizer, voice and its settings
  transcripts.tsv          id, speaker, text
  info.json                the arguments and tool versions
"""

import argparse
import array
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import wave

RATE = 16000
MIN_SECONDS, MAX_SECONDS = 1.0, 10.0

# The 39 phones of CMUdict (stress removed): the CTC outputs after the blank.
ARPABET = ["AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "EY", "F", "G",
           "HH", "IH", "IY", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH", "T",
           "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH"]
BLANK = "<blank>"

# espeak-ng 1.51's English phonemes (tables en, en-us, en-us-nyc, en-rp, en-sc, en-wm, en-n,
# en-wi and the consonants they use), without stress marks. Checked against what it prints in
# all eight accents for 1,500 sentences (--check-phonemes 1500) and for every distinct word of
# the sentence list.
ESPEAK_TO_ARPABET = {
    # consonants
    "b": "B", "d": "D", "D": "DH", "dZ": "JH", "f": "F", "g": "G", "h": "HH", "j": "Y",
    "k": "K", "l": "L", "m": "M", "n": "N", "N": "NG", "p": "P", "r": "R", "s": "S", "S": "SH",
    "t": "T", "T": "TH", "tS": "CH", "v": "V", "w": "W", "z": "Z", "Z": "ZH",
    "r-": "R",            # linking r ("far away", "operable")
    "r/": "R",            # r of rhotic accents
    "t#": "T",            # en-us flap (city, water)
    "t2": "T",            # en-us t before a stressed vowel
    "t[": "T",            # en-029 dental t for th
    "d#": "D",
    "?": "T",             # glottal stop for t (button, certain)
    "w#": "W",            # en-gb-scotland wh (which, when)
    "l/2": "L",
    "z#": "Z", "z/2": "Z",
    "x": "K",             # loch, Bach: CMUdict has K
    "n-": "AH N",         # syllabic n (button, wasn't), as CMUdict spells it
    # schwas and central vowels
    "@": "AH", "@2": "AH", "@5": "AH", "@-": "AH", "@#": "AH", "a#": "AH", "a#2": "AH",
    "a#:": "AH", "V": "AH",
    "@L": "AH L",         # syllabic l (little, bottle)
    "3": "ER", "3:": "ER", "IR": "ER", "VR": "ER",
    # front vowels
    "i": "IY", "i:": "IY", "e:": "EY", "eI": "EY",
    "I": "IH", "I2": "IH", "I#": "IH", "I2#": "IH",
    "E": "EH", "E#": "EH", "E2": "EH", "e#": "EH",
    "a": "AE", "a2": "AE", "aa": "AE", "a/": "AE",
    # back vowels
    "A:": "AA", "a:": "AA", "A#": "AA", "A~": "AA", "0": "AA", "0#": "AA", "02": "AA",
    "O": "AO", "O:": "AO", "O2": "AO", "O~": "AO",
    "o": "OW", "o:": "OW", "oU": "OW", "oU#": "OW",
    "U": "UH", "u": "UW", "u:": "UW",
    # diphthongs
    "aI": "AY", "aI2": "AY", "aU": "AW", "OI": "OY",
    "aI@": "AY AH",       # science, (en-gb) fire
    "aI3": "AY ER",       # (en-us) fire
    "aU@": "AW AH",
    # vowels with an r in CMUdict
    "A@": "AA R", "e@": "EH R", "i@3": "IH R", "O@": "AO R", "o@": "AO R", "U@": "UH R",
    "i@": "IY AH",        # idea, theater
}
# Pauses, syllable and linking marks: no sound of their own.
ESPEAK_SILENT = {"_", "_:", "_!", "_|", "_::", "_;_", "_^_", ";", "%", "%%", "=", "-", "||",
                 ":", "'!", "''", ",,"}

FLITE_TO_ARPABET = {p.lower(): p for p in ARPABET}
FLITE_TO_ARPABET.update({"ax": "AH", "axr": "ER", "hv": "HH", "nx": "N", "dx": "T",
                         "el": "AH L", "em": "AH M", "en": "AH N"})
FLITE_TO_ARPABET["ix"] = "IH"  # festival's reduced i (flite never prints it)
FLITE_SILENT = {"pau", "h#", "brth"}
FLITE_VOICES = ["rms", "kal16"]  # the only flite voices used; the others are held out
# The unseen family: festival's diphone voices, and the directories their packages install.
FESTIVAL_VOICES = {"kal_diphone": "festvox-kallpc16k", "ked_diphone": "festvox-kdlpc16k"}
FESTIVAL_VOICE_DIR = "/usr/share/festival/voices/english"


class CorpusError(Exception):
    pass


# ---- text ----------------------------------------------------------------------------------------

WORDNET_DIR = "/usr/share/wordnet"
FORTUNE_DIR = "/usr/share/games/fortunes"
# Fortune files that are not prose (pictures, code, non-English, command lines) or that we
# rather not put in a speaker's mouth.
FORTUNE_SKIP = {"art", "ascii-art", "translate-me", "perl", "debian", "linux", "linuxcookie",
                "ethnic"}
ALLOWED = re.compile(r"^[A-Za-z][A-Za-z0-9 .,;:!?'\"()-]*$")
ABBREVIATIONS = re.compile(r"\b(Mr|Mrs|Ms|Dr|St|Jr|Sr|Prof|Gen|Col|Capt|Lt|Sgt|vs|etc|e\.g|i\.e|"
                           r"No|Vol|Inc|Ltd|Co|Mt|U\.S|[A-Z])\.$")


def clean(s):
    s = s.replace("`", "'").replace("\t", " ")
    s = re.sub(r"\s+", " ", s).strip()
    return s.strip("\"' ")


def acceptable(s):
    if not ALLOWED.match(s):
        return False
    words = s.split()
    if not 3 <= len(words) <= 30:
        return False
    if re.search(r"\b[A-Z]{2,}:", s):  # "QOTD:", "BOFH:" headers
        return False
    letters = sum(c.isalpha() for c in s)
    return letters >= 0.7 * len(s.replace(" ", "")) and any(c.islower() for c in s)


def wordnet_sentences():
    out = []
    for pos in ["adj", "adv", "noun", "verb"]:
        path = os.path.join(WORDNET_DIR, "data." + pos)
        with open(path, encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):  # the licence header
                    continue
                parts = line.split(" | ", 1)
                if len(parts) < 2:
                    continue
                for example in re.findall(r'"([^"]+)"', parts[1]):
                    example = clean(example)
                    if acceptable(example):
                        out.append(example)
    return out


def fortune_sentences():
    out = []
    for name in sorted(os.listdir(FORTUNE_DIR)):
        if "." in name or name in FORTUNE_SKIP:
            continue
        with open(os.path.join(FORTUNE_DIR, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for record in text.split("\n%\n"):
            if "\b" in record:  # overstruck text
                continue
            lines = [l for l in record.split("\n") if not l.strip().startswith("--")]
            body = " ".join(l.strip() for l in lines)
            pieces = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", body)
            sentences = []
            for p in pieces:  # glue back what was cut after "Mr." and the like
                if sentences and ABBREVIATIONS.search(sentences[-1]):
                    sentences[-1] += " " + p
                else:
                    sentences.append(p)
            for s in sentences:
                s = clean(s)
                if acceptable(s) and s[-1] in ".!?":
                    out.append(s)
    return out


def load_sentences():
    """WordNet examples then fortune sentences, de-duplicated (case and punctuation ignored)."""
    for d in (WORDNET_DIR, FORTUNE_DIR):
        if not os.path.isdir(d):
            raise CorpusError("%s is missing; run `bash scripts/setup.sh speech`" % d)
    seen, out = set(), []
    for s in wordnet_sentences() + fortune_sentences():
        key = re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def split_sentences(sentences, seed):
    order = list(sentences)
    random.Random("%s:text" % seed).shuffle(order)
    n = len(order) // 20
    return {"dev": order[:n], "test": order[n:2 * n], "train": order[2 * n:]}


# ---- voices and speakers -------------------------------------------------------------------------

def run(cmd, what, input_text=None):
    try:
        r = subprocess.run(cmd, input=input_text, capture_output=True, text=True)
    except FileNotFoundError:
        raise CorpusError("%s: %s is not installed; run `bash scripts/setup.sh speech`"
                          % (what, cmd[0]))
    if r.returncode != 0:
        raise CorpusError("%s failed (exit %d): %s\n%s" % (what, r.returncode, " ".join(cmd),
                                                           r.stderr.strip()))
    return r.stdout


def espeak_accents():
    """The English espeak-ng voices (their language codes), without the mbrola ones."""
    out = run(["espeak-ng", "--voices=en"], "listing espeak-ng voices")
    accents = set()
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) >= 5 and f[4].startswith("gmw/"):
            accents.add(f[1])
    if not accents:
        raise CorpusError("espeak-ng lists no English voices")
    return sorted(accents)


def espeak_variants():
    out = run(["espeak-ng", "--voices=variant"], "listing espeak-ng variants")
    variants = set()
    for line in out.splitlines()[1:]:
        # The file column may hold a space ("!v/Mr serious"); columns are two or more spaces apart.
        m = re.search(r"\s!v/(.+?)(?:\s{2,}|\s*$)", line)
        if m:
            variants.add(m.group(1))
    if len(variants) < 10:
        raise CorpusError("espeak-ng lists only %d voice variants" % len(variants))
    return sorted(variants)


def split_variants(variants, seed):
    order = list(variants)
    random.Random("%s:variants" % seed).shuffle(order)
    n = max(1, len(order) // 10)
    return {"test": sorted(order[:n]), "dev": sorted(order[n:2 * n]),
            "train": sorted(order[2 * n:])}


def espeak_data_dir():
    """Where espeak-ng reads its voices from (`espeak-ng --version` prints "Data at: DIR")."""
    out = run(["espeak-ng", "--version"], "asking espeak-ng for its data directory")
    m = re.search(r"Data at:\s*(\S+)", out)
    if not m or not os.path.isdir(os.path.join(m.group(1), "voices", "!v")):
        raise CorpusError("espeak-ng --version names no data directory with voices/!v: %r"
                          % out.strip())
    return m.group(1)


def perturb_variant(text, name, tract, jitter, pitch_scale):
    """A copy of an espeak-ng variant file with its formant frequencies scaled.

    A variant scales formant k's frequency by `formant k FREQ HEIGHT WIDTH` (percent, 100 when the
    line is absent). Every formant 0-8 is scaled by the speaker's vocal-tract factor times its own
    jitter (a longer or shorter tract moves all formants together, not quite uniformly); a
    disabled formant (frequency 0) stays disabled; a formant the base variant leaves at espeak's
    defaults gets a line with height and width 100%, which is not always espeak's default (so even
    factors of 1 give a slightly different voice). The pitch line (base and range in Hz) is scaled
    too. Everything else of the base variant is kept."""
    lines, seen = [], set()
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "name":
            line = "name %s" % name
        elif len(f) >= 3 and f[0] == "formant" and f[1].isdigit() and int(f[1]) <= 8:
            k = int(f[1])
            seen.add(k)
            freq = float(f[2]) * tract * jitter[k]
            line = " ".join(["formant", f[1], str(int(round(freq)))] + f[3:])
        elif len(f) == 3 and f[0] == "pitch":
            line = "pitch %d %d" % (round(float(f[1]) * pitch_scale),
                                    round(float(f[2]) * pitch_scale))
        lines.append(line)
    for k in range(9):
        if k not in seen:
            lines.append("formant %d %d 100 100" % (k, round(100 * tract * jitter[k])))
    return "\n".join(lines) + "\n"


def make_festival_speakers(count, seed):
    """The unseen family's speakers: one per 25 utterances (at least 2), festival's diphone voices
    with a duration stretch and a pitch shift."""
    rng = random.Random("%s:speakers:unseen" % seed)
    return [{"id": "unseen-spk%03d" % i, "synth": "festival",
             "voice": rng.choice(sorted(FESTIVAL_VOICES)),
             "stretch": round(rng.uniform(0.85, 1.2), 3), "pitch_cents": rng.randint(-250, 250)}
            for i in range(max(2, math.ceil(count / 25)))]


def check_festival():
    for voice, package in sorted(FESTIVAL_VOICES.items()):
        if not os.path.isdir(os.path.join(FESTIVAL_VOICE_DIR, voice)):
            raise CorpusError("festival voice %s is not installed (Debian package %s; run `bash "
                              "scripts/setup.sh speech`, or --unseen 0 for no unseen-family set)"
                              % (voice, package))


def make_speakers(split, count, accents, variants, seed, data_dir=None, flite_share=1 / 6):
    """The speakers of a split.

    Dev and test: about one speaker per 25 utterances (at least 2), each an accent, a held-out
    variant, a pitch and a rate. Training: one speaker per 10 utterances, so that more accent x
    variant pairs occur; a share flite_share (a sixth by default) is flite; half of the espeak-ng
    ones speak through a perturbed copy of their variant (perturb_variant: vocal-tract factor 0.85..1.2, per-formant jitter
    0.9..1.1, pitch x 0.8..1.25), which widens the range of voices that training covers."""
    rng = random.Random("%s:speakers:%s" % (seed, split))
    train = split == "train"
    n = max(2, math.ceil(count / (10 if train else 25)))
    speakers = []
    for i in range(n):
        sid = "%s-spk%03d" % (split, i)
        if train and rng.random() < flite_share:
            speakers.append({"id": sid, "synth": "flite", "voice": rng.choice(FLITE_VOICES),
                             "stretch": round(rng.uniform(0.85, 1.2), 3),
                             "pitch_cents": rng.randint(-250, 250)})
            continue
        sp = {"id": sid, "synth": "espeak", "accent": rng.choice(accents),
              "variant": rng.choice(variants), "pitch": rng.randint(20, 80),
              "speed": rng.randint(140, 200)}
        if train and rng.random() < 0.5:
            tract = round(rng.uniform(0.85, 1.2), 3)
            jitter = [round(rng.uniform(0.9, 1.1), 3) for _ in range(9)]
            pitch_scale = round(rng.uniform(0.8, 1.25), 3)
            path = os.path.join(data_dir, "voices", "!v", sp["variant"])
            try:
                with open(path) as f:
                    base = f.read()
            except OSError as e:
                raise CorpusError("reading espeak-ng variant %s: %s" % (path, e))
            sp["base_variant"] = sp["variant"]
            sp["variant"] = "%s-%s" % (sid, sp["variant"].replace(" ", "_"))
            sp["perturbation"] = "tract=%s pitch_scale=%s" % (tract, pitch_scale)
            sp["variant_file"] = perturb_variant(base, sp["variant"], tract, jitter, pitch_scale)
        speakers.append(sp)
    return speakers


def make_espeak_data(root, data_dir):
    """An espeak-ng data directory (for --path) whose voices/!v can take one more variant file.

    Everything of the system's data directory is linked. Each worker process has its own and
    writes a perturbed speaker's variant there as PERTURBED just before synthesizing (espeak-ng
    lists at most 350 voices, so the perturbed variants of all speakers cannot sit side by side).
    Returns the directory to pass to --path."""
    data = os.path.join(root, "espeak-ng-data")
    vdir = os.path.join(data, "voices", "!v")
    os.makedirs(vdir)
    for entry in os.listdir(data_dir):
        if entry != "voices":
            os.symlink(os.path.join(data_dir, entry), os.path.join(data, entry))
    for entry in os.listdir(os.path.join(data_dir, "voices")):
        if entry != "!v":
            os.symlink(os.path.join(data_dir, "voices", entry),
                       os.path.join(data, "voices", entry))
    for entry in os.listdir(os.path.join(data_dir, "voices", "!v")):
        os.symlink(os.path.join(data_dir, "voices", "!v", entry), os.path.join(vdir, entry))
    return root


PERTURBED = "clustr-perturbed"  # the file name of the current perturbed variant


def check_variants(data_dir, speakers):
    """espeak-ng falls back to the plain voice, silently, when a variant file is missing."""
    for sp in speakers:
        if sp["synth"] == "espeak":
            name = sp.get("base_variant", sp["variant"])
            if not os.path.isfile(os.path.join(data_dir, "voices", "!v", name)):
                raise CorpusError("espeak-ng variant %r of speaker %s is not in %s"
                                  % (name, sp["id"], os.path.join(data_dir, "voices", "!v")))


def voice_name(speaker):
    if speaker["synth"] in ("flite", "festival"):
        return "%s %s" % (speaker["synth"], speaker["voice"])
    return "espeak-ng %s+%s" % (speaker["accent"], speaker["variant"])


# ---- planning ------------------------------------------------------------------------------------

def estimate_seconds(sentences, speaker, speed):
    words = sum(len(s.split()) for s in sentences)
    pauses = sum(len(re.findall(r"[,;:()]", s)) for s in sentences)
    if speaker["synth"] in ("flite", "festival"):
        t = words * 0.33 * speaker["stretch"]
    else:
        t = words * 60.0 / speaker["speed"]
    return (t + 0.45 * len(sentences) + 0.2 * pauses) / speed


def plan_split(split, count, pool, speakers, seed, out_dir):
    """One job per utterance; every choice drawn from seeded generators in a fixed order."""
    cursor_rng = random.Random("%s:order:%s" % (seed, split))
    order, cursor = [], 0

    def next_sentence():
        nonlocal order, cursor
        if cursor >= len(order):  # each sentence once, then again in a new order
            order = list(pool)
            cursor_rng.shuffle(order)
            cursor = 0
        cursor += 1
        return order[cursor - 1]

    jobs = []
    for i in range(count):
        rng = random.Random("%s:%s:%d" % (seed, split, i))
        speaker = rng.choice(speakers)
        speed = round(rng.uniform(0.9, 1.1), 3) if rng.random() < 0.5 else 1.0
        reverb = [rng.randint(10, 60), rng.randint(20, 100)] if rng.random() < 0.3 else None
        aug = {"speed": speed, "reverb": reverb, "noise": None,
               "level_db": round(rng.uniform(-20.0, -1.0), 2)}
        if rng.random() < 0.5:
            aug["noise"] = {"type": rng.choice(["white", "pink", "brown"]),
                            "snr_db": round(rng.uniform(5.0, 30.0), 2), "offset": rng.random()}
        target = rng.uniform(2.5, 9.5)
        sentences = []
        for _ in range(16):  # bounded: sentences too long for what is left are skipped
            if len(sentences) == 4 or (
                    sentences and estimate_seconds(sentences, speaker, speed) >= target):
                break
            s = next_sentence()
            if estimate_seconds(sentences + [s], speaker, speed) <= 9.0:
                sentences.append(s)
        if not sentences:
            sentences.append(min((next_sentence() for _ in range(8)), key=len))
        # Spoken in place of a lone sentence that still runs past 10 s.
        spare = min(rng.sample(pool, 4), key=len)
        uid = "%s%06d" % (split, i)
        jobs.append({"id": uid, "split": split, "speaker": speaker, "sentences": sentences,
                     "spare": spare,
                     "aug": aug, "wav": os.path.join(out_dir, "wav", split, uid + ".wav"),
                     "rel": "wav/%s/%s.wav" % (split, uid)})
    return jobs


# ---- phone labels --------------------------------------------------------------------------------

def espeak_labels(phonemes, context):
    """espeak-ng -x --sep=' ' output -> ARPAbet labels. Words are separated by two spaces."""
    labels = []
    for word in re.split(r" {2,}|\n", phonemes):
        out = []
        for token in word.split():
            symbol = token.lstrip("',")
            if not symbol or symbol in ESPEAK_SILENT:
                continue
            mapped = ESPEAK_TO_ARPABET.get(symbol)
            if mapped is None:
                raise CorpusError("espeak-ng phoneme %r has no ARPAbet mapping (%s)"
                                  % (symbol, context))
            for phone in mapped.split():
                if phone == "R" and out and out[-1] in ("R", "ER"):
                    continue
                out.append(phone)
        labels.extend(out)
    return labels


def flite_labels(phones, context, synth="flite"):
    labels = []
    for token in phones.split():
        if token in FLITE_SILENT:
            continue
        mapped = FLITE_TO_ARPABET.get(token)
        if mapped is None:
            raise CorpusError("%s phone %r has no ARPAbet mapping (%s)" % (synth, token, context))
        for phone in mapped.split():
            # ked_diphone's lexicon spells an r after er ("over": ow v er r): one R, as the
            # espeak-ng labels count it.
            if synth == "festival" and phone == "R" and labels and labels[-1] == "ER":
                continue
            labels.append(phone)
    return labels


# ---- audio ---------------------------------------------------------------------------------------

_worker = {}


def worker_init(tmp_root, noise_files, data_dir):
    d = tempfile.mkdtemp(dir=tmp_root)
    beds = {}
    for kind, path in noise_files.items():
        beds[kind] = read_pcm16(path)
    espeak_path = make_espeak_data(os.path.join(d, "espeak"), data_dir)
    _worker.update(tmp=d, beds=beds, espeak_path=espeak_path)


def read_pcm16(path):
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise CorpusError("%s: expected 16-bit mono" % path)
        data = array.array("h")
        data.frombytes(w.readframes(w.getnframes()))
    if sys.byteorder != "little":
        data.byteswap()
    return data


def rms(samples):
    if not samples:
        return 0.0
    return math.sqrt(math.fsum(x * x for x in samples) / len(samples))


def wav_seconds(path):
    with wave.open(path, "rb") as w:
        return w.getnframes() / float(w.getframerate())


def synthesize(job, sentences, raw):
    """Writes raw.wav; returns the labels."""
    sp = job["speaker"]
    text = " ".join(s if s[-1] in ".!?" else s + "." for s in sentences)
    text_file = os.path.join(_worker["tmp"], "text.txt")
    with open(text_file, "w") as f:
        f.write(text + "\n")
    context = "%s, utterance %s, text %r" % (voice_name(sp), job["id"], text)
    if sp["synth"] == "flite":
        out = run(["flite", "-voice", sp["voice"], "--setf", "duration_stretch=%s" % sp["stretch"],
                   "-ps", "-f", text_file, "-o", raw], "flite (%s)" % context)
        return flite_labels(out, context)
    if sp["synth"] == "festival":
        # Festival's Scheme: the voice, the stretch, one utterance of the text (double quotes
        # dropped: they are not spoken and would end the Scheme string), its wave and its
        # phones (the Segment relation) on standard output.
        script = os.path.join(_worker["tmp"], "say.scm")
        with open(script, "w") as f:
            f.write('(voice_%s)\n(Parameter.set \'Duration_Stretch %s)\n'
                    '(set! utt (Utterance Text "%s"))\n(utt.synth utt)\n'
                    '(utt.save.wave utt "%s" \'riff)\n'
                    '(mapcar (lambda (s) (format t "%%s " (item.name s))) '
                    '(utt.relation.items utt \'Segment))\n'
                    % (sp["voice"], sp["stretch"], text.replace('"', ""), raw))
        out = run(["festival", "--batch", script], "festival (%s)" % context)
        return flite_labels(out, context, "festival")
    variant = sp["variant"]
    if "variant_file" in sp:
        variant = PERTURBED
        with open(os.path.join(_worker["espeak_path"], "espeak-ng-data", "voices", "!v",
                               PERTURBED), "w") as f:
            f.write(sp["variant_file"])
    out = run(["espeak-ng", "--path=" + _worker["espeak_path"],
               "-v", "%s+%s" % (sp["accent"], variant), "-s", str(sp["speed"]),
               "-p", str(sp["pitch"]), "-a", "70", "-x", "--sep= ", "-w", raw, "-f", text_file],
              "espeak-ng (%s)" % context)
    return espeak_labels(out, context)


def generate(job):
    """Synthesises, augments and writes one utterance; returns its manifest fields."""
    tmp = _worker["tmp"]
    raw, clean_wav, seg = (os.path.join(tmp, n) for n in ("raw.wav", "clean.wav", "noise.raw"))
    aug, sp = job["aug"], job["speaker"]
    sentences = list(job["sentences"])
    noise = aug["noise"]
    first_out = clean_wav if noise else job["wav"]
    while True:
        labels = synthesize(job, sentences, raw)
        if not labels:
            raise CorpusError("utterance %s (%s): the synthesizer spoke no phones for %r"
                              % (job["id"], voice_name(sp), sentences))
        effects = []
        if sp["synth"] in ("flite", "festival") and sp["pitch_cents"]:
            effects += ["pitch", str(sp["pitch_cents"])]
        if aug["speed"] != 1.0:
            effects += ["speed", str(aug["speed"])]
        if aug["reverb"]:
            effects += ["reverb", str(aug["reverb"][0]), "50", str(aug["reverb"][1])]
        effects += ["rate", "-h", str(RATE), "channels", "1"]
        level = "-6" if noise else str(aug["level_db"])  # headroom for the noise
        run(["sox", "-D", raw, "-r", str(RATE), "-c", "1", "-b", "16", first_out] + effects +
            ["gain", "-n", level], "sox (%s)" % job["id"])
        if wav_seconds(first_out) <= MAX_SECONDS:
            break
        if len(sentences) > 1:
            sentences.pop()  # longer than planned: one sentence fewer
        elif sentences[0] != job["spare"]:
            sentences = [job["spare"]]  # the shortest of four sentences of the same pool
        else:
            break
    if noise:
        speech = read_pcm16(clean_wav)
        bed = _worker["beds"][noise["type"]]
        n = len(speech)
        if n > len(bed):
            reps = n // len(bed) + 1
            bed = bed * reps
        start = int(noise["offset"] * (len(bed) - n))
        piece = bed[start:start + n]
        gain = rms(speech) / max(rms(piece), 1e-9) / (10 ** (noise["snr_db"] / 20.0))
        if sys.byteorder != "little":
            piece.byteswap()
        with open(seg, "wb") as f:
            f.write(piece.tobytes())
        run(["sox", "-D", "-m", "-v", "1", clean_wav, "-v", "%.6f" % gain, "-t", "raw", "-r",
             str(RATE), "-e", "signed-integer", "-b", "16", "-c", "1", seg, "-b", "16",
             job["wav"], "gain", "-n", str(aug["level_db"])], "sox mix (%s)" % job["id"])
    return {"id": job["id"], "rel": job["rel"], "seconds": wav_seconds(job["wav"]),
            "labels": labels, "speaker": sp["id"], "text": " ".join(sentences)}


def make_noise_beds(tmp_root):
    files = {}
    for kind in ["white", "pink", "brown"]:
        path = os.path.join(tmp_root, kind + ".wav")
        # -R: sox's repeatable mode, a fixed seed for the noise generator.
        run(["sox", "-R", "-D", "-n", "-r", str(RATE), "-c", "1", "-b", "16", path, "synth", "30",
             kind + "noise", "gain", "-n", "-3"], "sox noise bed")
        files[kind] = path
    return files


# ---- the corpus ----------------------------------------------------------------------------------

def tool_versions(festival):
    """The Debian package version of each tool (flite has no --version that exits 0)."""
    versions = {}
    tools = [("espeak-ng", "espeak-ng"), ("sox", "sox"), ("flite", "flite")]
    if festival:
        tools += [("festival", "festival")]
    for tool, package in tools:
        if shutil.which(tool) is None:
            raise CorpusError("%s is not installed; run `bash scripts/setup.sh speech`" % tool)
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                           text=True) if shutil.which("dpkg-query") else None
        versions[tool] = r.stdout.strip() if r is not None and r.returncode == 0 else "unknown"
    return versions


def write_corpus(args):
    versions = tool_versions(args.unseen > 0)
    if args.unseen > 0:
        check_festival()
    out = os.path.abspath(args.out)
    if os.path.exists(os.path.join(out, "tokens.txt")) and not args.force:
        raise CorpusError("%s already holds a corpus; pass --force to replace it" % out)
    for sub in ["wav"]:
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
    counts = {"train": args.train, "dev": args.dev, "test": args.test}
    if args.unseen > 0:
        counts["unseen"] = args.unseen
    for split in counts:
        os.makedirs(os.path.join(out, "wav", split), exist_ok=True)

    t0 = time.time()
    pools = split_sentences(load_sentences(), args.seed)
    pools["unseen"] = pools["test"]  # never in training text
    accents = espeak_accents()
    variants = split_variants(espeak_variants(), args.seed)
    data_dir = espeak_data_dir()
    speakers, jobs = {}, []
    for split, count in counts.items():
        if split == "unseen":
            speakers[split] = make_festival_speakers(count, args.seed)
        else:
            speakers[split] = make_speakers(split, count, accents, variants[split], args.seed,
                                            data_dir, args.flite_share)
        jobs += plan_split(split, count, pools[split], speakers[split], args.seed, out)
    print("make_speech_corpus: %d sentences (train %d, dev %d, test %d), %d accents, "
          "variants train %d / dev %s / test %s"
          % (len(pools["train"]) + len(pools["dev"]) + len(pools["test"]), len(pools["train"]),
             len(pools["dev"]), len(pools["test"]), len(accents), len(variants["train"]),
             ",".join(variants["dev"]), ",".join(variants["test"])), file=sys.stderr)

    tmp_root = tempfile.mkdtemp(prefix="speech_corpus.")
    results = []
    try:
        noise_files = make_noise_beds(tmp_root)
        check_variants(data_dir, [sp for split in counts for sp in speakers[split]])
        with multiprocessing.Pool(args.jobs, worker_init,
                                  (tmp_root, noise_files, data_dir)) as pool:
            for k, r in enumerate(pool.imap(generate, jobs, chunksize=2)):
                results.append(r)
                if (k + 1) % 250 == 0 or k + 1 == len(jobs):
                    print("make_speech_corpus: %d/%d utterances, %.0f s"
                          % (k + 1, len(jobs), time.time() - t0), file=sys.stderr)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)

    by_split = {s: [] for s in counts}
    for job, r in zip(jobs, results):
        by_split[job["split"]].append(r)
    for split, rows in by_split.items():
        with open(os.path.join(out, split + ".tsv"), "w") as f:
            for r in rows:
                f.write("%s\t%s\t%.4f\t%s\n"
                        % (r["id"], r["rel"], r["seconds"], " ".join(r["labels"])))
    with open(os.path.join(out, "tokens.txt"), "w") as f:
        f.write("\n".join([BLANK] + ARPABET) + "\n")
    with open(os.path.join(out, "speakers.tsv"), "w") as f:
        f.write("speaker\tsplit\tsynth\tvoice\tsettings\n")
        for split in counts:
            for sp in speakers[split]:
                if sp["synth"] in ("flite", "festival"):
                    voice = sp["voice"]
                    settings = "stretch=%s pitch_cents=%s" % (sp["stretch"], sp["pitch_cents"])
                else:
                    voice = "%s+%s" % (sp["accent"], sp["variant"])
                    settings = "pitch=%s speed=%s" % (sp["pitch"], sp["speed"])
                    if "variant_file" in sp:
                        voice = "%s+%s" % (sp["accent"], sp["base_variant"])
                        settings += " perturbed " + sp["perturbation"]
                f.write("%s\t%s\t%s\t%s\t%s\n" % (sp["id"], split, sp["synth"], voice, settings))
    with open(os.path.join(out, "transcripts.tsv"), "w") as f:
        for r in results:
            f.write("%s\t%s\t%s\n" % (r["id"], r["speaker"], r["text"]))
    info = {"arguments": {"train": args.train, "dev": args.dev, "test": args.test,
                          "unseen": args.unseen, "flite_share": args.flite_share,
                          "seed": args.seed},
            "tools": versions, "held_out_variants": {"dev": variants["dev"],
                                                     "test": variants["test"]}}
    with open(os.path.join(out, "info.json"), "w") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")

    for split, rows in by_split.items():
        if rows:
            secs = [r["seconds"] for r in rows]
            print("make_speech_corpus: %-5s %5d utterances, %7.1f s (%.2f..%.2f s, mean %.2f s = "
                  "%.0f frames), %d speakers" % (split, len(rows), sum(secs), min(secs), max(secs),
                                                 sum(secs) / len(secs), sum(secs) / len(secs) * 100,
                                                 len(speakers[split])), file=sys.stderr)
    print("make_speech_corpus: wrote %s in %.0f s" % (out, time.time() - t0), file=sys.stderr)


# ---- the phoneme check ---------------------------------------------------------------------------

def phonemize(item):
    accent, sentence = item
    out = run(["espeak-ng", "-q", "-x", "--sep= ", "-v", accent, sentence + "\n"], "espeak-ng")
    return accent, sentence, out


def check_phonemes(args):
    """Phonemises N sentences in every accent and reports symbols that the table lacks."""
    sentences = load_sentences()
    random.Random("%s:check" % args.seed).shuffle(sentences)
    accents = espeak_accents()
    items = [(a, s) for s in sentences[:args.check_phonemes] for a in accents]
    counts, missing = {}, {}
    with multiprocessing.Pool(args.jobs) as pool:
        for accent, sentence, out in pool.imap(phonemize, items, chunksize=16):
            for token in out.split():
                symbol = token.lstrip("',")
                if not symbol:
                    continue
                counts[symbol] = counts.get(symbol, 0) + 1
                if symbol not in ESPEAK_TO_ARPABET and symbol not in ESPEAK_SILENT:
                    missing.setdefault(symbol, (accent, sentence))
    for symbol in sorted(counts):
        print("%-5s %8d  %s" % (symbol, counts[symbol],
                                ESPEAK_TO_ARPABET.get(symbol, "(silent)" if symbol in ESPEAK_SILENT
                                                      else "UNMAPPED")))
    for symbol, (accent, sentence) in sorted(missing.items()):
        print("unmapped %r, e.g. %s: %r" % (symbol, accent, sentence))
    print("%d sentences x %d accents: %d symbols, %d unmapped"
          % (args.check_phonemes, len(accents), len(counts), len(missing)))
    return 1 if missing else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="output directory")
    parser.add_argument("--train", type=int, default=8000, help="training utterances")
    parser.add_argument("--dev", type=int, default=500, help="dev utterances")
    parser.add_argument("--test", type=int, default=500, help="test utterances")
    parser.add_argument("--unseen", type=int, default=500,
                        help="unseen-family test utterances (festival's diphone voices; 0: none)")
    parser.add_argument("--flite-share", type=float, default=1 / 6,
                        help="share of the training speakers that are flite voices (rms, kal16)")
    parser.add_argument("--seed", type=int, default=1, help="seed of every random choice")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="parallel worker processes")
    parser.add_argument("--small", action="store_true",
                        help="a 24-utterance corpus for tests (12 train, 4 dev, 4 test, 4 "
                             "unseen)")
    parser.add_argument("--force", action="store_true", help="replace a corpus already in --out")
    parser.add_argument("--check-phonemes", type=int, metavar="N",
                        help="check the phoneme table on N sentences in every accent; no corpus")
    args = parser.parse_args()
    if args.small:
        args.train, args.dev, args.test, args.unseen = 12, 4, 4, min(args.unseen, 4)
    try:
        if args.jobs < 1:
            raise CorpusError("--jobs must be at least 1")
        if not 0 <= args.flite_share <= 1:
            raise CorpusError("--flite-share must be in [0, 1]")
        if args.check_phonemes is not None:
            return check_phonemes(args)
        if not args.out:
            parser.error("--out is required")
        if min(args.train, args.dev, args.test, args.unseen) < 0 or \
                args.train + args.dev + args.test + args.unseen == 0:
            raise CorpusError("--train/--dev/--test/--unseen must be >= 0 and not all 0")
        write_corpus(args)
    except CorpusError as e:
        print("make_speech_corpus: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

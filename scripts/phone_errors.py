#!/usr/bin/env python3
"""Where a speech model's phone errors are: PER, substitutions, deletions and insertions, the
most frequent confusions and the phones most often wrong, per voice of the corpus.

    build/apps/speech decode --checkpoint RUN --manifest CORPUS/unseen.tsv > decoded.txt
    scripts/phone_errors.py CORPUS/unseen.tsv decoded.txt [--corpus CORPUS] [--top 12]

The manifest gives the reference phones (its fourth column), `speech decode` the hypotheses
(utterance id, a tab, the phones). With --corpus, the corpus's transcripts.tsv (utterance ->
speaker) and speakers.tsv (speaker -> synthesizer and voice) group the utterances by voice;
without it, all of them form one group. Each reference is aligned with its hypothesis by the
edit distance (substitution, deletion and insertion each cost 1), as the PER counts them.
"""
import argparse
import collections
import sys
from pathlib import Path


def read_tsv(path, min_fields):
    """The rows of a tab-separated file with at least min_fields fields, header rows kept."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < min_fields:
                raise ValueError(f"{path}:{number}: expected at least {min_fields} "
                                 f"tab-separated fields, got {len(fields)}")
            rows.append(fields)
    return rows


def align(ref, hyp):
    """(reference phone or None, hypothesis phone or None) pairs of a least-cost alignment."""
    n, m = len(ref), len(hyp)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        cost[i][0] = i
    for j in range(m + 1):
        cost[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i][j] = min(cost[i - 1][j] + 1, cost[i][j - 1] + 1,
                             cost[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]))
    pairs, i, j = [], n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0 and cost[i][j] == cost[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            pairs.append((ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i > 0 and cost[i][j] == cost[i - 1][j] + 1:
            pairs.append((ref[i - 1], None))
            i -= 1
        else:
            pairs.append((None, hyp[j - 1]))
            j -= 1
    return pairs[::-1]


class Errors:
    def __init__(self):
        self.phones = 0
        self.subs = collections.Counter()  # (reference, hypothesis)
        self.dels = collections.Counter()
        self.ins = collections.Counter()
        self.seen = collections.Counter()  # reference phone -> occurrences
        self.wrong = collections.Counter()  # reference phone -> substituted or deleted

    def add(self, ref, hyp):
        self.phones += len(ref)
        for r, h in align(ref, hyp):
            if r is not None:
                self.seen[r] += 1
            if r is None:
                self.ins[h] += 1
            elif h is None:
                self.dels[r] += 1
                self.wrong[r] += 1
            elif r != h:
                self.subs[(r, h)] += 1
                self.wrong[r] += 1

    def report(self, name, top):
        s, d, i = sum(self.subs.values()), sum(self.dels.values()), sum(self.ins.values())
        per = (s + d + i) / self.phones if self.phones else 0.0
        print(f"{name}: {self.phones} phones, PER {per:.4f} "
              f"(substitutions {s}, deletions {d}, insertions {i})")
        print("  confusions:", ", ".join(f"{r}->{h} {n}" for (r, h), n in
                                        self.subs.most_common(top)))
        print("  deleted:", ", ".join(f"{p} {n}" for p, n in self.dels.most_common(top)))
        print("  inserted:", ", ".join(f"{p} {n}" for p, n in self.ins.most_common(top)))
        worst = sorted(self.wrong, key=lambda p: (-self.wrong[p], p))[:top]
        print("  most often wrong:", ", ".join(
            f"{p} {self.wrong[p] / self.seen[p]:.2f} of {self.seen[p]}" for p in worst))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path, help="the manifest that was decoded")
    parser.add_argument("decoded", type=Path, help="the output of speech decode")
    parser.add_argument("--corpus", type=Path, help="group by the voices of this corpus folder")
    parser.add_argument("--top", type=int, default=12, help="entries per list (default 12)")
    args = parser.parse_args()

    refs = {row[0]: row[3].split() for row in read_tsv(args.manifest, 4)}
    hyps = {}
    with open(args.decoded, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) == 2 and fields[0] in refs:  # other lines are speech's summary
                hyps[fields[0]] = fields[1].split()
    missing = [u for u in refs if u not in hyps]
    if missing:
        raise ValueError(f"{args.decoded}: no hypothesis for {len(missing)} of the manifest's "
                         f"{len(refs)} utterances (the first: {missing[0]})")

    group = {u: "all" for u in refs}
    if args.corpus:
        speaker = {row[0]: row[1] for row in read_tsv(args.corpus / "transcripts.tsv", 2)}
        voice = {row[0]: f"{row[2]} {row[3]}"
                 for row in read_tsv(args.corpus / "speakers.tsv", 4)[1:]}
        for u in refs:
            if u not in speaker or speaker[u] not in voice:
                raise ValueError(f"{args.corpus}: utterance {u} has no speaker with a voice in "
                                 "transcripts.tsv and speakers.tsv")
            group[u] = voice[speaker[u]]

    errors = collections.defaultdict(Errors)
    for u, ref in refs.items():
        errors[group[u]].add(ref, hyps[u])
    for name in sorted(errors):
        errors[name].report(name, args.top)


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:
        sys.exit(f"phone_errors: {e}")

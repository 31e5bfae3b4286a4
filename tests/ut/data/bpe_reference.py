#!/usr/bin/python3
"""A small byte-level BPE, written from the published algorithm (GPT-2's
byte-to-unicode alphabet, a pre-tokenizer regex, merges applied by rank),
independent of the C++ tokenizer it checks.

  bpe_reference.py train CORPUS MERGES OUT.json [--pattern gpt2|llama3] [--pairs]
      learns MERGES merges from CORPUS and writes a Hugging Face style
      tokenizer.json (merges as "a b" strings, or [a, b] pairs with --pairs)
  bpe_reference.py encode TOKENIZER.json TEXTS.jsonl
      prints one JSON list of ids per {"text": ...} line
"""
import json
import sys

import regex  # python3-regex: \\p{L}, \\p{N}

PATTERNS = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}


def byte_alphabet():
    """Byte -> printable character: printable Latin-1 bytes map to themselves,
    the rest to 256, 257, ... in byte order."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def pieces(pattern, text):
    return regex.findall(pattern, text)


def train(corpus, merges, out, pattern_name, pairs_form):
    alpha = byte_alphabet()
    pattern = PATTERNS[pattern_name]
    words = {}
    for p in pieces(pattern, open(corpus, encoding="utf-8", errors="replace").read()):
        w = tuple(alpha[b] for b in p.encode("utf-8"))
        words[w] = words.get(w, 0) + 1
    vocab = {alpha[b]: i for i, b in enumerate(range(256))}
    merge_list = []
    # Pair counts kept up to date: a merge recounts only the words holding it.
    words = [[list(w), n] for w, n in words.items()]
    counts, where = {}, {}
    for k, (w, n) in enumerate(words):
        for pair in zip(w, w[1:]):
            counts[pair] = counts.get(pair, 0) + n
            where.setdefault(pair, set()).add(k)
    for _ in range(merges):
        if not counts:
            break
        best = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if counts[best] <= 0:
            break
        merge_list.append(best)
        vocab[best[0] + best[1]] = len(vocab)
        for k in list(where.get(best, ())):
            w, n = words[k]
            for pair in zip(w, w[1:]):
                counts[pair] -= n
            out_w, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out_w.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out_w.append(w[i])
                    i += 1
            words[k][0] = out_w
            for pair in zip(out_w, out_w[1:]):
                counts[pair] = counts.get(pair, 0) + n
                where.setdefault(pair, set()).add(k)
        counts = {p: c for p, c in counts.items() if c > 0} if len(counts) > 4 * len(vocab) + 100000 else counts
        counts.pop(best, None)
    eot = len(vocab)
    if pattern_name == "gpt2":
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab,
                  "merges": [[a, b] for a, b in merge_list] if pairs_form else [a + " " + b for a, b in merge_list]},
    }
    json.dump(doc, open(out, "w", encoding="utf-8"), ensure_ascii=False)


def load(path):
    doc = json.load(open(path, encoding="utf-8"))
    m = doc["model"]
    ranks = {}
    for i, e in enumerate(m["merges"]):
        a, b = e.split(" ") if isinstance(e, str) else e
        ranks.setdefault((a, b), i)
    pre = doc["pre_tokenizer"]
    if pre["type"] == "ByteLevel":
        pattern = PATTERNS["gpt2"]
    else:
        pattern = pre["pretokenizers"][0]["pattern"]["Regex"]
    return m["vocab"], ranks, pattern, m.get("ignore_merges", False)


def bpe(word, ranks):
    """Merge the adjacent pair of lowest rank, every occurrence left to right,
    until no pair has a rank."""
    word = list(word)
    while len(word) > 1:
        best = min(((ranks.get((a, b), 1 << 60), (a, b)) for a, b in zip(word, word[1:])))
        if best[0] == 1 << 60:
            break
        a, b = best[1]
        out, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                out.append(a + b)
                i += 2
            else:
                out.append(word[i])
                i += 1
        word = out
    return word


def encode(tok_path, texts_path):
    vocab, ranks, pattern, ignore_merges = load(tok_path)
    alpha = byte_alphabet()
    for line in open(texts_path, encoding="utf-8"):
        if not line.strip():
            continue
        text = json.loads(line)["text"]
        ids = []
        for p in pieces(pattern, text):
            w = "".join(alpha[b] for b in p.encode("utf-8"))
            if ignore_merges and w in vocab:
                ids.append(vocab[w])
                continue
            ids.extend(vocab[s] for s in bpe(w, ranks))
        print(json.dumps(ids, separators=(",", ":")))


if __name__ == "__main__":
    if sys.argv[1] == "train":
        rest = sys.argv[5:]
        name = rest[rest.index("--pattern") + 1] if "--pattern" in rest else "gpt2"
        train(sys.argv[2], int(sys.argv[3]), sys.argv[4], name, "--pairs" in rest)
    elif sys.argv[1] == "encode":
        encode(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)

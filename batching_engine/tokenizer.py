"""Text in and out of token ids for one HF-format model directory.

Wraps the `tokenizers` library (tokenizer.json) and renders chat prompts with the model's own
Jinja template from tokenizer_config.json (or chat_template.jinja), falling back to ChatML
when the model has none. Streaming needs text that never changes once sent, which
`IncrementalDetokenizer` gives: it holds back a token until its bytes form whole characters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from batching_engine.token_bound import token_bound
from infergrid.errors import ContractError

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ChatMessageLike(Protocol):
    """Anything with a role and a content, such as the server's ChatMessage."""

    role: str
    content: str


Message = Mapping[str, Any] | ChatMessageLike


class Tokenizer:
    """Encode, decode, end-of-sequence ids and chat prompts for one model directory."""

    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ContractError("model_dir", f"{path} does not exist")
        self._tokenizer = HFTokenizer.from_file(str(path))
        # A tokenizer.json may carry the padding and truncation its exporter used (all-MiniLM's
        # pads and cuts every text to 128 tokens); transformers applies them only when asked,
        # and so do we: never. Too long an input is refused by the server, naming it.
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._config = _read_json(model_dir / "tokenizer_config.json")
        self.special_tokens = {
            key: _token_text(self._config.get(key)) for key in _SPECIAL_TOKEN_KEYS
        }
        self.eos_token_ids = frozenset(self._eos_ids(model_dir))
        self._template = _compile_template(_chat_template(model_dir, self._config))
        # None: this tokenizer may drop characters, so length alone proves nothing.
        self.token_bound = token_bound(json.loads(self._tokenizer.to_str()))

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. from a chat template)
        become their ids. Through `encode_batch`, which, unlike `encode`, lets go of the GIL:
        a long text tokenized on a worker thread then leaves the event loop free."""
        batch = self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
        return batch[0].ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, text: str) -> int | None:
        return self._tokenizer.token_to_id(text)

    def detokenizer(
        self, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = True
    ) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, prompt_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: Iterable[Message], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text for a conversation, ending with the assistant's turn opener."""
        checked = validate_messages(messages)
        try:
            return self._template.render(
                messages=checked, add_generation_prompt=add_generation_prompt, **self.special_tokens
            )
        except _TemplateRefusal as refusal:
            raise ContractError("messages", str(refusal)) from None

    def _eos_ids(self, model_dir: Path) -> set[int]:
        """EOS from the tokenizer, the model config and the generation config, all of them."""
        ids: set[int] = set()
        eos_text = self.special_tokens["eos_token"]
        if eos_text is not None and (eos_id := self.token_id(eos_text)) is not None:
            ids.add(eos_id)
        for name in ("config.json", "generation_config.json"):
            value = _read_json(model_dir / name).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [] if value is None else [value])
        return ids


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas that never need to be taken back.

    Decoding a window of recent tokens (rather than each token alone) keeps spacing right for
    tokenizers whose pieces depend on their neighbours; a delta ending in U+FFFD means a
    multi-byte character is still incomplete, so it waits for the next token.
    """

    _CONTEXT_TOKENS = 6

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prompt_ids)[-self._CONTEXT_TOKENS :]
        self._prefix = 0  # start of the decoding window
        self._read = len(self._ids)  # tokens before this are already emitted
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; returns the text it completes (possibly empty)."""
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """At end of stream: whatever is held back, incomplete characters included."""
        return self._emit(final=True)

    def _emit(self, *, final: bool) -> str:
        seen = self._tokenizer.decode(
            self._ids[self._prefix : self._read], skip_special_tokens=self._skip
        )
        window = self._tokenizer.decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        if len(window) <= len(seen) or (window.endswith("\ufffd") and not final):
            return ""
        delta = window[len(seen) :]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta


def validate_messages(messages: Iterable[Message]) -> list[dict[str, str]]:
    """Plain {role, content} dicts, or an error naming the bad field (`messages[2].role`)."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise ContractError("messages", "must be a list of messages")
    checked = [_message(message, f"messages[{index}]") for index, message in enumerate(messages)]
    if not checked:
        raise ContractError("messages", "must hold at least one message")
    return checked


def _message(message: Message, path: str) -> dict[str, str]:
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
    elif hasattr(message, "role") and hasattr(message, "content"):
        role, content = message.role, message.content
    else:
        raise ContractError(path, "must be an object with role and content")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        raise ContractError(f"{path}.role", f"must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
    if not isinstance(content, str):
        raise ContractError(f"{path}.content", f"must be a string, got {type(content).__name__}")
    return {"role": role, "content": content}


class _TemplateRefusal(Exception):
    """A chat template's own `raise_exception(...)`: the conversation breaks its rules."""


def _raise_exception(message: str) -> None:
    raise _TemplateRefusal(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _compile_template(source: str) -> jinja2.Template:
    """Compile at load time, so a broken template stops the engine at start."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ContractError("chat_template", f"line {error.lineno}: {error.message}") from None


def _chat_template(model_dir: Path, config: dict[str, Any]) -> str:
    """chat_template.jinja, else tokenizer_config's chat_template (a string, or named
    templates of which "default" is used), else ChatML."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    if template is None:
        return CHATML_TEMPLATE
    if not isinstance(template, str):
        raise ContractError("chat_template", "must be a string or a list of named templates")
    return template


def _token_text(value: Any) -> str | None:
    """Special tokens are saved either as text or as {"content": text, ...}."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ContractError(path.name, f"not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ContractError(path.name, "must be a JSON object")
    return document

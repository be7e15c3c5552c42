"""Text in and out of a model directory's tokenizer, chat prompts and streamed text.

The tokenizer is trained on the spot: a byte-level BPE with ChatML special tokens, small
enough that an emoji is several byte tokens (which is what streaming must not cut apart).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batching_engine.tokenizer import ChatMessageLike, Tokenizer
from harness.tiny_model_dir import write_bpe_tokenizer
from infergrid.errors import ContractError
from tests.batching_engine.tiny_bert import write_wordpiece_tokenizer

CORPUS = ["hello world, the quick brown fox jumps over the lazy dog"] * 20 + ["café naïve 123"] * 5
TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def write_model_dir(path: Path, tokenizer_config: dict | None = None, **files: dict) -> Path:
    write_bpe_tokenizer(path, CORPUS, vocab_size=300, tokenizer_config=tokenizer_config)
    for name, document in files.items():
        (path / f"{name}.json").write_text(json.dumps(document))
    return path


@pytest.fixture
def tokenizer(tmp_path) -> Tokenizer:
    return Tokenizer(write_model_dir(tmp_path))


@pytest.mark.parametrize(
    "text", ["hello world", "café naïve 123", "  spaces\n\nand 😀 emoji ünïcödé"]
)
def test_text_round_trips(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_in_text_become_their_ids_and_are_skipped_when_decoding(tokenizer):
    ids = tokenizer.encode("<|im_start|>hello<|im_end|>")
    assert ids[0] == tokenizer.token_id("<|im_start|>") and ids[-1] == tokenizer.token_id(
        "<|im_end|>"
    )
    assert tokenizer.decode(ids) == "hello"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>hello<|im_end|>"


def test_a_bert_tokenizer_adds_cls_and_sep_and_not_the_padding_or_cut_it_was_saved_with(
    tmp_path,
):
    write_wordpiece_tokenizer(tmp_path)  # saved padding and cutting every text to 16 tokens
    tokenizer = Tokenizer(tmp_path)
    cls, sep = tokenizer.token_id("[CLS]"), tokenizer.token_id("[SEP]")
    short = tokenizer.encode("the dog")
    assert short[0] == cls and short[-1] == sep and len(short) == 4
    assert len(tokenizer.encode("the quick brown fox " * 10)) == 42
    assert tokenizer.encode("the dog", add_special_tokens=False) == short[1:-1]


def test_eos_ids_come_from_the_tokenizer_and_both_model_configs(tmp_path):
    write_model_dir(
        tmp_path, config={"eos_token_id": 0}, generation_config={"eos_token_id": [0, 1]}
    )
    assert Tokenizer(tmp_path).eos_token_ids == {0, 1, 2}  # <|im_end|> is id 2


def test_streamed_deltas_add_up_to_the_decoded_text_and_never_split_a_character(tokenizer):
    text = "hello 😀 café, ünïcödé fox"
    ids = tokenizer.encode(text)
    stream = tokenizer.detokenizer()
    deltas = [stream.push(token) for token in ids] + [stream.flush()]
    assert "".join(deltas) == text == stream.text
    assert not any("\ufffd" in delta for delta in deltas)
    emoji_bytes = len(tokenizer.encode("😀"))
    assert emoji_bytes > 1 and deltas.count("") >= emoji_bytes - 1  # held back until whole


def test_streaming_after_a_prompt_emits_only_the_new_text(tokenizer):
    prompt = tokenizer.encode("the quick brown")
    stream = tokenizer.detokenizer(prompt)
    continuation = tokenizer.encode(" fox jumps")
    assert "".join(stream.push(t) for t in continuation) + stream.flush() == " fox jumps"


def test_the_models_chat_template_renders_the_conversation(tmp_path):
    tokenizer = Tokenizer(write_model_dir(tmp_path, {"chat_template": TEMPLATE}))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages) == "[system] be brief\n[user] hi\n[assistant]"
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False).endswith("hi\n")


def test_a_chat_template_jinja_file_wins_over_tokenizer_config(tmp_path):
    write_model_dir(tmp_path, {"chat_template": "from config"})
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }} from file")
    assert (
        Tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "x from file"
    )


def test_without_a_template_chatml_is_used(tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_message_objects_with_role_and_content_attributes_are_accepted(tokenizer):
    class Message:
        role, content = "user", "hi"

    message: ChatMessageLike = Message()
    assert "user\nhi" in tokenizer.apply_chat_template([message])


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "^messages: must hold at least one message"),
        ("hi", "^messages: must be a list of messages"),
        ([{"role": "user", "content": "a"}, "b"], r"^messages\[1\]: must be an object with role"),
        (
            [{"role": "user", "content": "a"}] * 2 + [{"role": "robot", "content": "c"}],
            r"^messages\[2\]\.role: must be one of system, .*, got 'robot'",
        ),
        ([{"role": "user", "content": 5}], r"^messages\[0\]\.content: must be a string, got int"),
        ([{"content": "no role"}], r"^messages\[0\]\.role: must be one of"),
    ],
)
def test_bad_messages_are_refused_naming_the_field(tokenizer, messages, message):
    with pytest.raises(ContractError, match=message):
        tokenizer.apply_chat_template(messages)


def test_a_template_that_refuses_the_conversation_answers_with_its_reason(tmp_path):
    template = (
        "{% if messages[0].role != 'user' %}"
        "{{ raise_exception('first turn must be the user') }}"
        "{% endif %}"
    )
    tokenizer = Tokenizer(write_model_dir(tmp_path, {"chat_template": template}))
    with pytest.raises(ContractError, match="^messages: first turn must be the user"):
        tokenizer.apply_chat_template([{"role": "assistant", "content": "hi"}])


def test_a_broken_template_stops_loading_naming_the_field(tmp_path):
    write_model_dir(tmp_path, {"chat_template": "{% for m in messages %}"})
    with pytest.raises(ContractError, match="^chat_template: line 1"):
        Tokenizer(tmp_path)


def test_a_directory_without_tokenizer_json_is_refused(tmp_path):
    with pytest.raises(ContractError, match="^model_dir: .*tokenizer.json does not exist"):
        Tokenizer(tmp_path)

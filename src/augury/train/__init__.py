"""Training drafter heads on this machine: collect the target's states, train, export.

    corpus.py    what the head learns from: the target's own conversations (Magpie-style) and --data
    features.py  the target's hidden states and top-k log-probabilities over that corpus, in shards
    trainer.py   the time-budgeted training loop, checkpoints, held-out acceptance by position
    export.py    the speculators layout that vLLM serves

Kept light: nothing here is imported until `augury train` runs.
"""

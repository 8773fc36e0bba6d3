"""rlvr: reinforcement learning with verifiable rewards (GRPO and relatives) for small LLMs."""

__version__ = "0.1.0"

"""Engine integrations: the code that maps an engine's block operations onto the agent.

``block_queue`` holds the engine-agnostic replacement free queue; ``vllm`` is the only
module that imports vLLM (and it is imported only by vLLM's plugin loader).
"""

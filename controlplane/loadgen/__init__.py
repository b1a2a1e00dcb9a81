"""Trace-driven load for a real OpenAI-compatible completions server (``kvwise bench serve``).

Owns turning a block-level trace into real requests whose prompts share exactly what the
trace's requests share (``prompts``), sending them at trace times through a concurrency
cap while timing the first token and the end of each stream (``runner``, ``client``),
reading what the server and the kvwise controller report about themselves (``observe``),
and the run's summary and the comparison of two runs (``report``). It must never import
the agent, the controller's service or a policy: it sees servers only through HTTP.
"""

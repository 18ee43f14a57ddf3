"""Generative models: the request every door takes (a prompt or chat messages and
sampling parameters), the chat template and tokenizer, sampling, and the text a
sequence of tokens makes (with stop sequences). The decode loop that runs them
is app.runtime.decode; the jobs that carry them, app.engine.core."""

"""The rollout driver's room: the engine protocol (`engine`) and the scripted engine for tests
(`scripted_engine`), the chat template's renderer (`chat`), tokenizer training (`tokenizer`) and the ReAct tree
driver (`driver`), the only code that tokenizes. It stands on `tracerl.io.env` (the environment protocol) and
`tracerl.io.files` (rows); nothing in io below it imports it.
"""

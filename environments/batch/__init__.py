"""batch_runner.py's internals (the script is the entry point; its docstring is the user's guide).

`config`: BatchConfig, the prompt file, toolset distributions; `output`: the output file, records,
progress and statistics; `runner`: one prompt and the whole run; `cli`: the flags; `on_ray`: the
same run on Ray workers (Ray is imported only there, and that module only with --ray).
"""

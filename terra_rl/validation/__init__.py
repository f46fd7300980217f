"""CPU validation gates: named, self-contained checks with a PASS/FAIL, run before a launch.

`terra_rl.validation.registry.GATES` lists every case in order; pytest runs each one
(`tests/test_validation.py`) and `scripts/validation/validate_gates.py` is their CLI
(`terra_rl.validation.cli`). Importing this package imports no JAX, so the CLI can set
`JAX_PLATFORMS` first. See docs/VALIDATION.md.

Modules: `gate` (the case type, options, results, running one case), `registry` (the
ordered cases), `small` (the shared tiny shapes and their compiled functions), `references`
(NumPy references and checks shared with tests), the cases by area (`env_gates`,
`reset_gates`, `model_gates`, `train_gates`, `loop_gates`), and `cli`.
"""

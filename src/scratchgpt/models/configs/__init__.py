"""Every model's hyperparameters, one dataclass per model, as plain data: no torch here.

A config is what a checkpoint saves (as a dict, :func:`scratchgpt.models.config_dict`), what
``scratchgpt train`` makes its model flags from, and what a model is built from; each file
holds the config of the model file of the same name in ``models/`` (``configs/gpt.py`` for
``models/gpt.py``), and the model files import their configs from here.
"""

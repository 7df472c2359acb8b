"""The model: T5 v1.1 built from a config, never downloaded. One module per concern:

* :mod:`~training.model.t5`: building the model, FSDP2 sharding, activation checkpointing, its signature;
* :mod:`~training.model.meta_init`: a random init on the meta device, each rank materialising only its shards;
* :mod:`~training.model.attention`: the attention kernels (sdpa, eager, sdpa_bias, flex);
* :mod:`~training.model.flex`: FlexAttention with the position bias as a score_mod, masks as block masks;
* :mod:`~training.model.compile`: regional torch.compile of the T5 blocks;
* :mod:`~training.model.compile_cache`: compiled artefacts kept across restarts, keyed by settings, torch and code;
* :mod:`~training.model.pretrained`: the check of a ``--model.init_from`` directory (torch-free).

Importing the package imports no torch.
"""

"""The RL math: advantage estimators (advantages.py, what each needs: needs.py), policy and value losses
(losses.py; a loss may have a module of its own, as cispo.py), KL estimators (kl.py), DAPO
helpers (dapo.py), the SFT and preference losses.

Estimators, losses and KL estimators are named in string registries (rlkit.core.registrations) so a
recipe names them; docs/algorithms.md gives each one's formula, paper and option names. This package file imports
nothing, so the config layer can read needs.py without loading torch.
"""

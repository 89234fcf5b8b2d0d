"""What drafters share, one layer below the method files (which import only `harness.core` and
this package): the Drafter interface and checkpoint plumbing (base), the draft-vocabulary head
(draft_vocab), checkpoint file I/O (checkpoint_io), the static-tree heads of Medusa and Hydra
(heads), residual blocks (blocks), the losses a drafter computes (losses) and EAGLE's draft head
(eagle_core). An external drafter builds on the same parts: `from methods.common.base import Drafter`.
"""

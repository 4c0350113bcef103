import numpy as np
import pytest
import torch as th

# Two cores on CI: one torch thread per test process keeps runs predictable.
th.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    np.random.seed(0)
    th.manual_seed(0)

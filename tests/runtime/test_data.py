"""How many steps the training data can give: each step trains `batch_groups` prompts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.runtime.data import check_steps_fit_data


@given(st.integers(1, 200), st.integers(1, 16), st.integers(1, 400), st.integers(1, 5))
def test_steps_fit_exactly_when_the_data_gives_their_prompts(steps, batch_groups, prompts, epochs):
    fits = steps * batch_groups <= prompts * epochs
    if fits:
        check_steps_fit_data(steps, batch_groups, prompts, epochs)
    else:
        with pytest.raises(ValueError, match="trainer.steps"):
            check_steps_fit_data(steps, batch_groups, prompts, epochs)


@given(st.integers(1, 16), st.integers(1, 400), st.integers(1, 5))
def test_no_steps_means_what_the_data_gives_and_always_fits(batch_groups, prompts, epochs):
    check_steps_fit_data(None, batch_groups, prompts, epochs)

"""Fault injection specs (HF_VIT_SCALING_FAULTS). The faults inside real runs are in
tests/launched/test_reliability.py."""

import pytest

from hf_vit_scaling import UserInputError
from hf_vit_scaling.faults import Fault, parse_faults


def test_fault_specs_parse_and_reject_typos():
    assert parse_faults("sigkill@12:rank1, nan@7,save_fail@10") == [
        Fault("sigkill", 12, 1), Fault("nan", 7, None), Fault("save_fail", 10, None)]
    assert Fault("nan", 7).hits("nan", 7, rank=3) and not Fault("nan", 7, 1).hits("nan", 7, rank=0)
    with pytest.raises(UserInputError, match="unknown fault 'sigterm'"):
        parse_faults("sigterm@3")
    with pytest.raises(UserInputError, match="KIND@STEP"):
        parse_faults("sigkill-12")

import dp_accounting
import pytest

from pate_accountant import EpsilonDeltaEvent, Release, ThresholdPrivacyEvent
from pate_accountant.release import FAIL, TARGET, TOKEN


def test_events_are_validated_dp_events():
    event = EpsilonDeltaEvent(0.5, 1e-6)
    assert isinstance(event, dp_accounting.DpEvent)
    assert event == EpsilonDeltaEvent(0.5, 1e-6) and hash(event) == hash(EpsilonDeltaEvent(0.5, 1e-6))
    assert event.relation == "replace-one"
    with pytest.raises(ValueError, match="epsilon must be >= 0.0, got -1.0"):
        EpsilonDeltaEvent(-1.0)
    with pytest.raises(ValueError, match="delta must be < 1.0, got 1.0"):
        EpsilonDeltaEvent(1.0, 1.0)
    with pytest.raises(ValueError, match="relation must be one of"):
        EpsilonDeltaEvent(1.0, relation="swap")
    with pytest.raises(ValueError, match="threshold must be >= 1"):
        ThresholdPrivacyEvent(0)
    with pytest.raises(AttributeError):
        event.epsilon = 2.0  # frozen


def test_release_outcomes():
    event = ThresholdPrivacyEvent(3)
    assert Release(7, event).outcome == TOKEN
    assert Release(None, event).outcome == FAIL and Release(None, event).failed
    assert Release(None, event, target_hit=True).outcome == TARGET
    assert Release(1, event, charged_teachers=[3, 1]).charged_teachers == frozenset({1, 3})
    with pytest.raises(TypeError, match="event must be a dp_accounting.DpEvent"):
        Release(1, "eps=1")
    with pytest.raises(ValueError, match="non-negative teacher indices"):
        Release(1, event, charged_teachers=[-1])

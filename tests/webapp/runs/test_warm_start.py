"""A start's wait for warm standbys (webapp/runs/warm_start.py): how many each region
wants, the wait on a clock of the test's own, and what the event says of a cold start.
(A start through the run services that waits: tests/webapp/runs/test_runtime_services.py.)"""

from webapp.runs.warm_start import cold_start_message, standbys_wanted, wait_for_standbys

CONFIG = {"islands": [
    {"name": "east-a", "region": "us-east"},
    {"name": "east-b", "region": "us-east", "processes": 1},
    {"name": "east-big", "region": "us-east", "processes": 4},
    {"name": "west-a", "region": "us-west"},
]}


def test_each_region_wants_a_standby_per_island_of_one_process_and_one_for_a_rejoin():
    assert standbys_wanted(CONFIG, ["east-a", "east-b", "east-big", "west-a"], None) == {
        "us-east": {"islands": 2, "wanted": 3}, "us-west": {"islands": 1, "wanted": 2}}


def test_the_pool_size_caps_what_a_region_wants_and_unknown_names_count_for_nothing():
    assert standbys_wanted(CONFIG, ["east-a", "east-b", "west-a", "ghost"], 2) == {
        "us-east": {"islands": 2, "wanted": 2}, "us-west": {"islands": 1, "wanted": 2}}
    assert standbys_wanted(CONFIG, ["east-big"], None) == {}


class Pools:
    """Regions with a pool host, and the standbys each has ready at each look."""

    def __init__(self, ready: dict[str, list[int]]):
        self.looks = {region: iter(counts) for region, counts in ready.items()}
        self.last: dict[str, int] = {}

    def hosts(self, region):
        return ["host-1"] if region in self.looks else []

    def ready(self, region):
        self.last[region] = next(self.looks[region], self.last.get(region, 0))
        return self.last[region]


class Clock:
    def __init__(self):
        self.now = 0.0
        self.slept = 0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        self.slept += 1


def test_the_wait_ends_once_every_pooled_region_has_what_it_wants():
    clock = Clock()
    wanted = {"us-east": {"islands": 2, "wanted": 3}}

    short = wait_for_standbys(Pools({"us-east": [0, 1, 3]}), wanted, 30.0,
                              clock=clock, sleep=clock.sleep)

    assert short == {}
    assert clock.slept == 2


def test_regions_without_a_pool_are_not_waited_for():
    clock = Clock()
    wanted = {"us-east": {"islands": 1, "wanted": 2}, "us-west": {"islands": 1, "wanted": 2}}

    assert wait_for_standbys(Pools({"us-east": [2]}), wanted, 30.0,
                             clock=clock, sleep=clock.sleep) == {}
    assert clock.slept == 0


def test_at_the_deadline_the_regions_short_of_standbys_for_their_islands_are_named():
    clock = Clock()
    wanted = {"us-east": {"islands": 2, "wanted": 3}, "us-west": {"islands": 1, "wanted": 2}}

    short = wait_for_standbys(Pools({"us-east": [1], "us-west": [1]}), wanted, 5.0,
                              clock=clock, sleep=clock.sleep)

    # us-west has one for its island (not the rejoin's): its island starts warm
    assert short == {"us-east": {"islands": 2, "wanted": 3, "ready": 1}}
    assert clock.now >= 5.0


def test_the_cold_start_message_counts_the_cold_islands_and_says_what_was_ready():
    one = {"us-east": {"islands": 2, "wanted": 3, "ready": 1}}
    two = {"us-west": {"islands": 1, "wanted": 2, "ready": 0}, **one}

    assert cold_start_message(one, 5.0) == (
        "1 island starts cold: after 5 s us-east had 1 of 3 standbys ready")
    assert cold_start_message(two, 2.5) == (
        "2 islands start cold: after 2.5 s us-east had 1 of 3 standbys ready, "
        "us-west had 0 of 2 standbys ready")

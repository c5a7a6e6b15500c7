"""Self-play: a learning policy against frozen snapshots of itself, rated with Elo.

The algorithm holds the learning policy (`learner`, the only one trained) and a fixed
ring of `window` snapshot modules: every `snapshot_every` iterations the learner's
weights are copied into the oldest slot. Fixed modules mean no module is ever added to
a running algorithm, so runners Ray restarts or a rescale adds hold every one of them.
Each episode one agent (drawn per episode) plays the learner; the others play the
current learner with chance `p_current`, else one snapshot of the window.

Ratings follow Elo from the learner's results against each snapshot; a snapshot keeps
the rating the learner had when it was taken. The learner's seat (the agent drawn to
play it) is rated against each other seat a snapshot plays, one game per seat; seats
playing the current learner say nothing about its strength and are not rated.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

LEARNER = "learner"
INITIAL_RATING = 1000.0
# Elo's K per game; an iteration's games count at most MAX_RATED_GAMES times, so a
# batch of hundreds of games moves the rating steadily instead of overshooting.
ELO_K = 16.0
MAX_RATED_GAMES = 32
# The most snapshot modules a run holds (each is a module in every runner and learner).
MAX_WINDOW = 32


def snapshot_id(slot: int) -> str:
    return f"snapshot_{slot}"


class SelfPlaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    snapshot_every: int = Field(default=5, ge=1, description="K: iterations between snapshots")
    window: int = Field(
        default=5, ge=1, le=MAX_WINDOW, description="W: snapshots opponents come from"
    )
    p_current: float = Field(
        default=0.2, ge=0.0, le=1.0, description="P: chance an opponent is the current learner"
    )

    def module_ids(self) -> list[str]:
        return [LEARNER, *(snapshot_id(i) for i in range(self.window))]


@dataclass
class SelfPlayMapping:
    """RLlib's policy_mapping_fn under self-play (picklable). `opponents` is the window's
    filled snapshots; the driver updates it on every runner after a snapshot."""

    agents: tuple[str, ...]
    opponents: tuple[str, ...]
    p_current: float

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        seat, opponent = self.draw(episode)
        return LEARNER if str(agent_id) == seat else opponent

    def learner_seat(self, episode: Any) -> str:
        """The agent that plays the learner in `episode`: the one whose results rate it
        (other agents may play the current learner too, as opponents)."""
        return self.draw(episode)[0]

    def draw(self, episode: Any) -> tuple[str, str]:
        """The episode's one draw, seeded by its id, so every agent of it (and every
        process asking) gets the same: the agent that plays the learner, and the module
        the other agents play (the learner itself with chance `p_current`, else one of
        the opponents)."""
        rng = random.Random(_episode_seed(episode))
        seat = self.agents[rng.randrange(len(self.agents))]
        if not self.opponents or rng.random() < self.p_current:
            return seat, LEARNER
        return seat, rng.choice(self.opponents)


def _episode_seed(episode: Any) -> str:
    return str(getattr(episode, "id_", ""))


@dataclass
class Outcomes:
    """The learner's results against one opponent in one iteration."""

    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def score(self) -> float:
        return (self.wins + 0.5 * self.draws) / self.games if self.games else 0.0


def expected_score(rating: float, opponent: float) -> float:
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0))


def elo_update(rating: float, opponent: float, outcomes: Outcomes) -> float:
    """The learner's rating after `outcomes` against a frozen opponent."""
    if not outcomes.games:
        return rating
    weight = ELO_K * min(outcomes.games, MAX_RATED_GAMES)
    return rating + weight * (outcomes.score - expected_score(rating, opponent))


@dataclass
class Snapshot:
    number: int  # snapshot:N in `uerl eval --opponent` and `uerl export --snapshot`
    iteration: int
    rating: float


@dataclass
class League:
    """The driver's self-play state; saved with every checkpoint (`league.json`)."""

    settings: SelfPlaySettings
    rating: float = INITIAL_RATING
    # Snapshot slot (module id) -> what it holds.
    slots: dict[str, Snapshot] = field(default_factory=dict)
    taken: int = 0

    def due(self, iteration: int) -> bool:
        return iteration % self.settings.snapshot_every == 0

    def next_slot(self) -> str:
        """The slot the next snapshot goes to: an empty one, else the oldest."""
        return snapshot_id(self.taken % self.settings.window)

    def took(self, slot: str, iteration: int) -> Snapshot:
        snapshot = Snapshot(self.taken, iteration, self.rating)
        self.slots[slot] = snapshot
        self.taken += 1
        return snapshot

    def opponents(self) -> tuple[str, ...]:
        return tuple(sorted(self.slots))

    def slot_of(self, number: int) -> str | None:
        return next((s for s, snap in self.slots.items() if snap.number == number), None)

    def record(self, outcomes: dict[str, Outcomes]) -> None:
        """Rate the learner on this iteration's games against the snapshots."""
        rating = self.rating
        for slot, result in sorted(outcomes.items()):
            if slot in self.slots:
                rating += elo_update(self.rating, self.slots[slot].rating, result) - self.rating
        self.rating = rating

    def to_json(self) -> str:
        return json.dumps(
            {
                "settings": self.settings.model_dump(),
                "rating": self.rating,
                "taken": self.taken,
                "slots": {slot: asdict(snap) for slot, snap in sorted(self.slots.items())},
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> League:
        data = json.loads(text)
        return cls(
            settings=SelfPlaySettings.model_validate(data["settings"]),
            rating=float(data["rating"]),
            slots={slot: Snapshot(**snap) for slot, snap in data["slots"].items()},
            taken=int(data["taken"]),
        )

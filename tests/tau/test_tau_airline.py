"""τ²-bench's airline domain: the bundled sample and a published task (airline task "14" with the slice
of the published airline data it touches, tests/tau/published_airline_task14.json) scored by gold
replay; a skipped write and a write the tools allow but the policy forbids score 0; one scripted
conversation through the real agent loop with `--env.domain airline`."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from atroposlib.envs.base import APIServerConfig

from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
from environments.tau.domain import db_hash, get_domain
from environments.tau.env import TauEnv, TauEnvConfig
from environments.tau.scoring import gold_db
from environments.tau.tasks import BUNDLED_DATA_DIR, Task, load_domain_data
from environments.tau.user_sim import UserModelConfig
from tests.support.scripted_openai import ScriptedOpenAIServer
from tests.tau import scripts
from tests.tau.scripts import ScriptedAgent, customer, gold_steps

PUBLISHED = json.loads((Path(__file__).parent / "published_airline_task14.json").read_text())
AIRLINE = get_domain("airline")
_BAGS = {"reservation_id": "QX7R2D", "payment_id": "gift_card_8852031"}


def run(task: Task, base: dict[str, Any], steps: list[tuple[str, Any]]):
    return scripts.run(AIRLINE, task, base, steps)


def said(task: Task) -> list[tuple[str, Any]]:
    assert task.evaluation_criteria is not None
    return [("say", f"That comes to ${info}.") for info in task.evaluation_criteria.communicate_info or []]


@pytest.fixture(scope="module")
def bundled():
    return load_domain_data(BUNDLED_DATA_DIR, "airline")


def test_bundled_sample_has_the_published_shape(bundled) -> None:
    raw = json.loads((BUNDLED_DATA_DIR / "domains" / "airline" / "tasks.json").read_text())
    published = PUBLISHED["task"]
    for task in raw:
        assert set(task) == set(published)
        assert set(task["description"]) == set(published["description"])
        assert set(task["user_scenario"]) == set(published["user_scenario"])
        assert set(task["user_scenario"]["instructions"]) == set(published["user_scenario"]["instructions"])
        assert set(task["evaluation_criteria"]) == set(published["evaluation_criteria"])
        for action in task["evaluation_criteria"]["actions"]:
            assert set(action) == set(published["evaluation_criteria"]["actions"][0])
    ours, theirs = AIRLINE.load_db(bundled.db), AIRLINE.load_db(PUBLISHED["db"])
    assert set(ours) == set(theirs) == {"flights", "users", "reservations"}
    for kind in ("flights", "users", "reservations"):
        (sample,) = [set(v) for v in theirs[kind].values()][:1]
        assert all(set(v) == sample for v in ours[kind].values()), kind
    # Each per-date status has the published fields of that status.
    by_status = {d["status"]: set(d) for f in theirs["flights"].values() for d in f["dates"].values()}
    for flight in ours["flights"].values():
        for day in flight["dates"].values():
            assert day["status"] not in by_status or set(day) == by_status[day["status"]]
    assert [t.id for t in bundled.tasks] == ["0", "1", "2"]
    assert "Basic economy flights cannot be changed" in bundled.policy
    assert [t.id for t in load_domain_data(BUNDLED_DATA_DIR, "airline", split="test").tasks] == ["2"]


def test_gold_actions_score_one_on_every_bundled_task(bundled) -> None:
    for task in bundled.tasks:
        score = run(task, bundled.db, gold_steps(task) + said(task))
        assert score.reward == 1.0 and score.db_match, (task.id, score)


def test_skipping_a_required_write_scores_zero(bundled) -> None:
    for task in bundled.tasks:
        steps = [s for s in gold_steps(task) if AIRLINE.tools[s[1][0]].kind != "write"]
        score = run(task, bundled.db, steps + said(task))
        assert score.reward == 0.0 and not score.db_match, task.id


def test_cancelling_a_basic_economy_reservation_the_policy_forbids_scores_zero(bundled) -> None:
    """Task 2: Lena also asks to cancel B4NK9E (basic economy, booked five days ago, no insurance, its
    flight not cancelled). The tool does it; the policy forbids it; the DB hash tells."""
    task = bundled.tasks[2]
    extra = ("call", ("cancel_reservation", {"reservation_id": "B4NK9E"}))
    score = run(task, bundled.db, [*gold_steps(task), extra, *said(task)])
    assert score.reward == 0.0 and not score.db_match
    db = AIRLINE.load_db(bundled.db)
    assert AIRLINE.call(db, "cancel_reservation", {"reservation_id": "B4NK9E"})["status"] == "cancelled"
    # Removing a bag is also refused by policy, not by the tool.
    bags = ("call", ("update_reservation_baggages", {**_BAGS, "total_baggages": 0, "nonfree_baggages": 0}))
    assert run(bundled.tasks[1], bundled.db, [*gold_steps(bundled.tasks[1]), bags, *said(bundled.tasks[1])]).reward == 0


def test_the_published_task_gold_actions_score_one() -> None:
    task = Task.model_validate(PUBLISHED["task"])
    assert task.evaluation_criteria is not None
    assert [r.value for r in task.evaluation_criteria.reward_basis] == ["DB", "COMMUNICATE"]
    told = [("say", "Gift cards: $327 in all; certificates: $1000. The mastercard is charged $1,786.")]
    gold = run(task, PUBLISHED["db"], gold_steps(task) + told)
    assert gold.reward == 1.0 and gold.db_match and gold.communicate == [True, True, True]
    assert run(task, PUBLISHED["db"], gold_steps(task)[:1] + told).reward == 0.0  # no booking
    assert run(task, PUBLISHED["db"], gold_steps(task)).reward == 0.0  # sums never said
    # The booking did what the published tool does: the first new id, 3 x (364 + 248 + 259) = 2613 paid
    # exactly, the certificate used up, both gift cards emptied, seats taken; the old one refunded.
    db = gold_db(task, AIRLINE, AIRLINE.load_db(PUBLISHED["db"]))
    new, old = db["reservations"]["HATHAT"], db["reservations"]["K1NW8N"]
    assert [s["price"] for s in new["flights"]] == [364, 248, 259] and new["created_at"] == "2024-05-15T15:00:00"
    assert sum(p["amount"] for p in new["payment_history"]) == 2613
    methods = db["users"]["mohamed_silva_9265"]["payment_methods"]
    assert "certificate_3765853" not in methods and "certificate_9984806" in methods
    assert methods["gift_card_8020792"]["amount"] == methods["gift_card_6136092"]["amount"] == 0
    assert db["flights"]["HAT204"]["dates"]["2024-05-28"]["available_seats"]["business"] == 17 - 3
    assert old["status"] == "cancelled" and old["payment_history"][-1] == {
        "payment_id": "gift_card_6136092",
        "amount": -567,
    }
    assert db["users"]["mohamed_silva_9265"]["reservations"] == ["K1NW8N", "HATHAT"]


def test_refused_writes_leave_the_database_as_it_was(bundled) -> None:
    db = AIRLINE.load_db(bundled.db)
    before = db_hash(db)
    lena = [{"first_name": "Lena", "last_name": "Ortiz", "dob": "1988-02-14"}]
    book = {
        "user_id": "lena_ortiz_3310",
        "origin": "SFO",
        "destination": "SEA",
        "flight_type": "one_way",
        "cabin": "economy",
        "flights": [{"flight_number": "HAT610", "date": "2024-05-18"}],
        "passengers": lena,
        "payment_methods": [
            {"payment_id": "gift_card_8852031", "amount": 120},
            {"payment_id": "credit_card_4417260", "amount": 19},
        ],
        "total_baggages": 0,
        "nonfree_baggages": 0,
        "insurance": "no",
    }
    refused = [
        ("book_reservation", {**book, "payment_methods": [{"payment_id": "credit_card_4417260", "amount": 100}]}),
        ("book_reservation", {**book, "flights": [{"flight_number": "HAT610", "date": "2024-05-15"}]}),  # flying
        ("book_reservation", {**book, "payment_methods": [{"payment_id": "gift_card_8852031", "amount": 139}]}),
        ("book_reservation", {**book, "cabin": "first"}),
        ("book_reservation", {**book, "passengers": lena * 10}),  # 9 economy seats left
        (
            "update_reservation_flights",
            {**_BAGS, "cabin": "economy", "flights": [], "payment_id": "certificate_6630195"},
        ),
        (
            "update_reservation_flights",
            {
                "reservation_id": "QX7R2D",
                "cabin": "business",
                "payment_id": "gift_card_8852031",
                "flights": [
                    {"flight_number": "HAT501", "date": "2024-05-20"},
                    {"flight_number": "HAT502", "date": "2024-05-24"},
                ],
            },
        ),
        ("update_reservation_baggages", {**_BAGS, "total_baggages": 9, "nonfree_baggages": 5}),  # 250 > 120 on the card
        ("update_reservation_passengers", {"reservation_id": "B4NK9E", "passengers": lena}),
        ("get_flight_status", {"flight_number": "HAT999", "date": "2024-05-20"}),
    ]
    for name, args in refused:
        with pytest.raises(ValueError):
            AIRLINE.call(db, name, args)
        assert db_hash(db) == before, name
    # The same booking, paid right: 139 economy, the gift card debited, a seat taken, the first new id.
    reservation = AIRLINE.call(db, "book_reservation", book)
    assert reservation["reservation_id"] == "HATHAT" and reservation["status"] is None
    assert db["users"]["lena_ortiz_3310"]["payment_methods"]["gift_card_8852031"]["amount"] == 0
    assert db["flights"]["HAT610"]["dates"]["2024-05-18"]["available_seats"]["economy"] == 8
    # A change to a cheaper itinerary refunds the difference to the gift card as a negative payment.
    moved = AIRLINE.call(
        db,
        "update_reservation_flights",
        {
            "reservation_id": "QX7R2D",
            "cabin": "economy",
            "payment_id": "gift_card_8852031",
            "flights": [
                {"flight_number": "HAT501", "date": "2024-05-21"},
                {"flight_number": "HAT502", "date": "2024-05-24"},
            ],
        },
    )
    assert moved["payment_history"][-1] == {"payment_id": "gift_card_8852031", "amount": 171 - 180}
    assert db["users"]["lena_ortiz_3310"]["payment_methods"]["gift_card_8852031"]["amount"] == 9
    assert AIRLINE.call(db, "send_certificate", {"user_id": "omar_haddad_7721", "amount": 100}).startswith(
        "Certificate certificate_3221322 added"
    )


def test_searches_offer_only_bookable_dates(bundled) -> None:
    db = AIRLINE.load_db(bundled.db)
    call = AIRLINE.call
    assert call(db, "get_flight_status", {"flight_number": "HAT502", "date": "2024-05-15"}) == "delayed"
    assert call(db, "search_direct_flight", {"origin": "SFO", "destination": "SEA", "date": "2024-05-15"}) == []
    (hit,) = call(db, "search_direct_flight", {"origin": "ORD", "destination": "JFK", "date": "2024-05-25"})
    assert (hit["flight_number"], hit["prices"]["economy"], hit["status"]) == ("HAT502", 190, "available")
    assert len(call(db, "list_all_airports", {})) == 20
    # A connection leaves the hub no earlier than the first leg lands, on the right date.
    db["flights"]["HAT502"]["dates"]["2024-05-20"] = copy.deepcopy(db["flights"]["HAT502"]["dates"]["2024-05-24"])
    (pair,) = call(db, "search_onestop_flight", {"origin": "JFK", "destination": "JFK", "date": "2024-05-20"})
    assert [(leg["flight_number"], leg["date"]) for leg in pair] == [("HAT501", "2024-05-20"), ("HAT502", "2024-05-20")]


OPENING = "Hi, I'm Lena Ortiz, user id lena_ortiz_3310. Please add three checked bags to reservation QX7R2D."
BAGS_GOLD = [
    ("call", "get_user_details", {"user_id": "lena_ortiz_3310"}),
    ("call", "get_reservation_details", {"reservation_id": "QX7R2D"}),
    ("say", "As a gold member in economy you have 3 free bags; the 4th costs $50 on your gift card. Confirm?", None),
]
BAGS_WRITE = ("call", "update_reservation_baggages", {**_BAGS, "total_baggages": 4, "nonfree_baggages": 1})
DONE = ("say", "Done: 4 bags, one paid.", None)


async def test_a_scripted_agent_through_the_loop_with_the_airline_domain(tmp_path: Path) -> None:
    cfg = EmbeddedLLMConfig()
    tokenizer_dir = str(ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template()))
    async with ScriptedOpenAIServer([]) as agent_server, ScriptedOpenAIServer([customer(OPENING)] * 6) as user_server:
        config = TauEnvConfig(
            tokenizer_name=tokenizer_dir,
            use_wandb=False,
            data_path_to_save_groups=None,
            domain="airline",
            user_model=UserModelConfig(base_url=user_server.base_url, model="customer"),
        )
        server = APIServerConfig(
            base_url=agent_server.base_url, model_name="scripted", api_key="x", server_type="openai"
        )
        env = TauEnv(config, [server])
        await env.setup()
        task = env.data().tasks[1]
        names = {t["function"]["name"] for t in env.tool_schemas()}
        assert len(names) == 14 and {"book_reservation", "search_onestop_flight"} <= names and "think" not in names
        assert "Basic economy flights cannot be changed" in env.initial_messages(task)[0]["content"]
        async with env.runtime():
            gold = ScriptedAgent([*BAGS_GOLD, BAGS_WRITE, DONE])
            r_gold = await env.rollout(task, model=gold)
            r_skip = await env.rollout(task, model=ScriptedAgent([*BAGS_GOLD, DONE]))
            group = env.build_group([r_gold, r_skip])
    assert r_gold.error is None and r_gold.result.tool_errors == []
    assert json.loads(gold.tool_results[-1])["payment_history"][-1] == {"payment_id": "gift_card_8852031", "amount": 50}
    assert (r_gold.score, r_skip.score) == (1.0, 0.0)
    assert r_gold.result.ended == "user_stop" and len(user_server.requests) == 6 and agent_server.requests == []
    assert [i["domain"] for i in group["rollout_info"]] == ["tau2_airline", "tau2_airline"]
    assert group["rollout_info"][0]["task_id"] == "tau2-airline-1"

"""τ²-bench's airline domain: flights with per-date status, users with payment methods, reservations;
14 tools (the published toolkit's `think` is commented out there, so it is not offered here).

Written from the benchmark's tool semantics (src/tau2/domains/airline/tools.py and its data model),
not copied; tests/tau/test_tau_upstream_diff.py checks it against the published package on every
task. What the published tools do, and gold replays depend on:
- "now" is 2024-05-15T15:00:00; new reservations take the first free id of HATHAT, HATHAU, HATHAV;
  `send_certificate` adds the first free id of certificate_3221322/3/4.
- Booking prices each flight at its date's cabin price per passenger, plus 30 per passenger for
  insurance and 50 per non-free bag; the payments must add up to exactly that. A gift card is
  debited, a certificate is used up whole (removed from the user), a credit card is not tracked.
- Changing flights keeps a segment (and its old price) when flight, date and cabin are unchanged,
  prices new segments now, and charges (or, negative, refunds) the difference; baggage changes
  charge 50 per added non-free bag. Neither takes a certificate; a gift card must cover a charge.
- Cancelling refunds every payment (a negative payment each) and releases no seats; changing
  flights does not touch seat counts either.
- The tools enforce no policy (cancelling basic economy succeeds): the policy is the agent's to
  follow, and the DB hash checks it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from environments.tau.domain import CALCULATE, TRANSFER_TO_HUMAN_AGENTS, Domain, DomainTool

__all__ = ["DOMAIN"]

Db = dict[str, Any]

NOW = "2024-05-15T15:00:00"
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")
CABINS = ("business", "economy", "basic_economy")
FLIGHT_TYPES = ("round_trip", "one_way")
INSURANCE = ("yes", "no")
INSURANCE_FEE = 30
BAG_FEE = 50
# The airports list_all_airports names, in its order.
AIRPORTS = (
    "SFO:San Francisco,JFK:New York,LAX:Los Angeles,ORD:Chicago,DFW:Dallas,DEN:Denver,SEA:Seattle,ATL:Atlanta,"
    "MIA:Miami,BOS:Boston,PHX:Phoenix,IAH:Houston,LAS:Las Vegas,MCO:Orlando,EWR:Newark,CLT:Charlotte,"
    "MSP:Minneapolis,DTW:Detroit,PHL:Philadelphia,LGA:LaGuardia"
).split(",")


class Reservation(BaseModel):
    """The fields of the published Reservation model its booking tool validates (named so that pydantic's
    message names it as the published one does)."""

    flight_type: Literal["round_trip", "one_way"]
    cabin: Literal["business", "economy", "basic_economy"]
    total_baggages: int
    nonfree_baggages: int
    insurance: Literal["yes", "no"]


def _normalise(db: Db) -> None:
    # As the published model dumps them: optional fields present, stored-value amounts as floats.
    for user_id, user in db.get("users", {}).items():
        user.setdefault("user_id", user_id)
        user.get("address", {}).setdefault("address2", None)
        for method in user.get("payment_methods", {}).values():
            if method.get("source") in ("gift_card", "certificate"):
                method["amount"] = float(method["amount"])
    for reservation in db.get("reservations", {}).values():
        reservation.setdefault("status", None)


def _user(db: Db, user_id: str) -> dict[str, Any]:
    if user_id not in db["users"]:
        raise ValueError(f"User {user_id} not found")
    return db["users"][user_id]


def _reservation(db: Db, reservation_id: str) -> dict[str, Any]:
    if reservation_id not in db["reservations"]:
        raise ValueError(f"Reservation {reservation_id} not found")
    return db["reservations"][reservation_id]


def _flight(db: Db, flight_number: str) -> dict[str, Any]:
    if flight_number not in db["flights"]:
        raise ValueError(f"Flight {flight_number} not found")
    return db["flights"][flight_number]


def _flight_date(db: Db, flight_number: str, date: str) -> dict[str, Any]:
    dates = _flight(db, flight_number)["dates"]
    if date not in dates:
        raise ValueError(f"Flight {flight_number} not found on date {date}")
    return dates[date]


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    return int(value)


def _fields(obj: Any, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or any(k not in obj for k in keys):
        raise ValueError(f"each of {what} needs {list(keys)}, got {obj!r}")
    return {k: obj[k] for k in keys}


def _passengers(passengers: Any) -> list[dict[str, Any]]:
    if not isinstance(passengers, list):
        raise ValueError("passengers must be a list of {first_name, last_name, dob}")
    return [_fields(p, ("first_name", "last_name", "dob"), "passengers") for p in passengers]


def _flight_infos(flights: Any) -> list[dict[str, Any]]:
    if not isinstance(flights, list):
        raise ValueError("flights must be a list of {flight_number, date}")
    return [_fields(f, ("flight_number", "date"), "flights") for f in flights]


def _bookable(db: Db, info: dict[str, Any], cabin: str, seats: int) -> tuple[dict[str, Any], dict[str, Any]]:
    flight = _flight(db, info["flight_number"])
    day = _flight_date(db, info["flight_number"], info["date"])
    if day["status"] != "available":
        raise ValueError(f"Flight {info['flight_number']} not available on date {info['date']}")
    if day["available_seats"][cabin] < seats:
        raise ValueError(f"Not enough seats on flight {info['flight_number']}")
    return flight, day


def _segment(flight: dict[str, Any], date: str, price: int) -> dict[str, Any]:
    return {
        "flight_number": flight["flight_number"],
        "origin": flight["origin"],
        "destination": flight["destination"],
        "date": date,
        "price": price,
    }


def _charge_for_update(reservation: dict[str, Any], user: dict[str, Any], payment_id: str, amount: int) -> None:
    """Checks and debits the method for a change of `reservation`, recording the payment when one is due."""
    method = user["payment_methods"].get(payment_id)
    if method is None:
        raise ValueError("Payment method not found")
    if method["source"] == "certificate":
        raise ValueError("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < amount:
        raise ValueError("Gift card balance is not enough")
    if method["source"] == "gift_card":
        method["amount"] -= amount
    if amount != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": amount})


def _direct(db: Db, date: str, origin: str | None, destination: str | None, leave_after: str | None = None):
    out = []
    for flight in db["flights"].values():
        day = flight["dates"].get(date)
        if (
            day is not None
            and day["status"] == "available"
            and origin in (None, flight["origin"])
            and destination in (None, flight["destination"])
            and (leave_after is None or flight["scheduled_departure_time_est"] >= leave_after)
        ):
            out.append(
                {
                    "flight_number": flight["flight_number"],
                    "origin": flight["origin"],
                    "destination": flight["destination"],
                    "status": "available",
                    "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
                    "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"],
                    "date": None,
                    "available_seats": dict(day["available_seats"]),
                    "prices": dict(day["prices"]),
                }
            )
    return out


# ---- tools --------------------------------------------------------------------------------------


def book_reservation(
    db: Db,
    user_id: str,
    origin: str,
    destination: str,
    flight_type: str,
    cabin: str,
    flights: list[dict[str, Any]],
    passengers: list[dict[str, Any]],
    payment_methods: list[dict[str, Any]],
    total_baggages: int,
    nonfree_baggages: int,
    insurance: str,
) -> dict[str, Any]:
    """Book a reservation. The payments must add up to the exact total: cabin price per passenger per flight, plus 30
    per passenger with insurance, plus 50 per non-free bag."""
    infos, people = _flight_infos(flights), _passengers(passengers)
    payments = [_fields(p, ("payment_id", "amount"), "payment_methods") for p in payment_methods]
    for p in payments:
        p["amount"] = _int(p["amount"], "a payment amount")
    user = _user(db, user_id)
    reservation_id = next((r for r in NEW_RESERVATION_IDS if r not in db["reservations"]), None)
    if reservation_id is None:
        raise ValueError("Too many reservations")
    # Checked where and as the published tool checks them: by its Reservation model (pydantic's message).
    fields = {"flight_type": flight_type, "cabin": cabin, "total_baggages": total_baggages}
    try:
        checked = Reservation.model_validate({**fields, "nonfree_baggages": nonfree_baggages, "insurance": insurance})
    except ValidationError as exc:
        raise ValueError(str(exc)) from None
    total_baggages, nonfree_baggages = checked.total_baggages, checked.nonfree_baggages

    segments, days, price = [], [], 0
    for info in infos:
        flight, day = _bookable(db, info, cabin, len(people))
        segments.append(_segment(flight, info["date"], day["prices"][cabin]))
        days.append(day)
        price += day["prices"][cabin] * len(people)
    if insurance == "yes":
        price += INSURANCE_FEE * len(people)
    price += BAG_FEE * nonfree_baggages
    for p in payments:
        method = user["payment_methods"].get(p["payment_id"])
        if method is None:
            raise ValueError(f"Payment method {p['payment_id']} not found")
        if method["source"] in ("gift_card", "certificate") and method["amount"] < p["amount"]:
            raise ValueError(f"Not enough balance in payment method {p['payment_id']}")
    paid = sum(p["amount"] for p in payments)
    if paid != price:
        raise ValueError(f"Payment amount does not add up, total price is {price}, but paid {paid}")

    for p in payments:
        method = user["payment_methods"].get(p["payment_id"])
        if method is None:  # the same certificate listed twice: used up by its first mention
            continue
        if method["source"] == "gift_card":
            method["amount"] -= p["amount"]
        elif method["source"] == "certificate":
            del user["payment_methods"][p["payment_id"]]
    for day in days:
        day["available_seats"][cabin] -= len(people)
    reservation = {
        "reservation_id": reservation_id,
        "user_id": user_id,
        "origin": origin,
        "destination": destination,
        "flight_type": flight_type,
        "cabin": cabin,
        "flights": segments,
        "passengers": people,
        "payment_history": payments,
        "created_at": NOW,
        "total_baggages": total_baggages,
        "nonfree_baggages": nonfree_baggages,
        "insurance": insurance,
        "status": None,
    }
    db["reservations"][reservation_id] = reservation
    user["reservations"].append(reservation_id)
    return reservation


def cancel_reservation(db: Db, reservation_id: str) -> dict[str, Any]:
    """Cancel a whole reservation; every payment is refunded to its method."""
    reservation = _reservation(db, reservation_id)
    refunds = [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in reservation["payment_history"]]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    return reservation


def get_reservation_details(db: Db, reservation_id: str) -> dict[str, Any]:
    """A reservation's flights, passengers, payments and bags."""
    return _reservation(db, reservation_id)


def get_user_details(db: Db, user_id: str) -> dict[str, Any]:
    """A user's profile: name, address, membership, payment methods, saved passengers, reservations."""
    return _user(db, user_id)


def get_flight_status(db: Db, flight_number: str, date: str) -> str:
    """The status of a flight on a date (available, on time, delayed, flying, landed, cancelled)."""
    return str(_flight_date(db, flight_number, date)["status"])


def list_all_airports(db: Db) -> list[dict[str, str]]:
    """IATA codes and cities of every airport served."""
    return [dict(zip(("iata", "city"), airport.split(":"))) for airport in AIRPORTS]


def search_direct_flight(db: Db, origin: str, destination: str, date: str) -> list[dict[str, Any]]:
    """Bookable direct flights between two airports on a date, with seats and prices per cabin."""
    return _direct(db, date, origin, destination)


def search_onestop_flight(db: Db, origin: str, destination: str, date: str) -> list[list[dict[str, Any]]]:
    """Bookable pairs of connecting flights between two airports departing on a date."""
    pairs = []
    for first in _direct(db, date, origin, None):
        first["date"] = date
        # As published: a first leg landing the next day looks for the second on "2024-05-<day + 1>",
        # written without zero padding (so before the 9th it finds nothing).
        date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first["scheduled_arrival_time_est"] else date
        for second in _direct(db, date2, first["destination"], destination, first["scheduled_arrival_time_est"]):
            second["date"] = date2
            pairs.append([first, second])
    return pairs


def send_certificate(db: Db, user_id: str, amount: int) -> str:
    """Add a travel certificate of `amount` dollars to a user's payment methods. Only as the policy allows."""
    user = _user(db, user_id)
    for certificate_id in NEW_CERTIFICATE_IDS:
        if certificate_id not in user["payment_methods"]:
            method = {"source": "certificate", "id": certificate_id, "amount": float(amount)}
            user["payment_methods"][certificate_id] = method
            return f"Certificate {certificate_id} added to user {user_id} with amount {amount}."
    raise ValueError("Too many certificates")


def update_reservation_baggages(
    db: Db, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
) -> dict[str, Any]:
    """Set a reservation's total and non-free bag counts; 50 per added non-free bag is charged to payment_id (not a
    certificate)."""
    total_baggages, nonfree_baggages = (
        _int(total_baggages, "total_baggages"),
        _int(nonfree_baggages, "nonfree_baggages"),
    )
    reservation = _reservation(db, reservation_id)
    user = _user(db, reservation["user_id"])
    due = BAG_FEE * max(0, nonfree_baggages - reservation["nonfree_baggages"])
    _charge_for_update(reservation, user, payment_id, due)
    reservation["total_baggages"] = total_baggages
    reservation["nonfree_baggages"] = nonfree_baggages
    return reservation


def update_reservation_flights(
    db: Db, reservation_id: str, cabin: str, flights: list[dict[str, Any]], payment_id: str
) -> dict[str, Any]:
    """Replace a reservation's flights (list EVERY segment of the new itinerary, changed or not) and cabin; the price
    difference is charged or refunded to payment_id (not a certificate)."""
    infos = _flight_infos(flights)
    reservation = _reservation(db, reservation_id)
    user = _user(db, reservation["user_id"])
    seats = len(reservation["passengers"])
    segments, price = [], 0
    for info in infos:
        kept = next(
            (
                s
                for s in reservation["flights"]
                if s["flight_number"] == info["flight_number"]
                and s["date"] == info["date"]
                and cabin == reservation["cabin"]
            ),
            None,
        )
        if kept is None:
            flight, day = _bookable(db, info, cabin, seats)
            kept = _segment(flight, info["date"], day["prices"][cabin])
        segments.append(kept)
        price += kept["price"] * seats
    price -= sum(s["price"] for s in reservation["flights"]) * seats
    _charge_for_update(reservation, user, payment_id, price)
    reservation["flights"] = segments
    reservation["cabin"] = cabin
    return reservation


def update_reservation_passengers(db: Db, reservation_id: str, passengers: list[dict[str, Any]]) -> dict[str, Any]:
    """Replace a reservation's passenger details (same number of passengers)."""
    people = _passengers(passengers)
    reservation = _reservation(db, reservation_id)
    if len(people) != len(reservation["passengers"]):
        raise ValueError("Number of passengers does not match")
    reservation["passengers"] = people
    return reservation


# ---- schemas ----------------------------------------------------------------------------------

_S = {"type": "string"}
_INT = {"type": "integer"}
_RES = {"type": "string", "description": "The reservation id, such as 'ZFA04Y'"}
_USER = {"type": "string", "description": "The user id, such as 'sara_doe_496'"}
_CABIN = {"type": "string", "description": "'business', 'economy' or 'basic_economy'"}
_DATE = {"type": "string", "description": "YYYY-MM-DD, such as '2024-05-01'"}
_AIRPORT = {"type": "string", "description": "IATA airport code, such as 'JFK'"}
_PAY_ID = {
    "type": "string",
    "description": "A payment method id from the user's profile, such as 'credit_card_7815826' or 'gift_card_7815826'",
}
_FLIGHTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"flight_number": {"type": "string", "description": "such as 'HAT001'"}, "date": _DATE},
        "required": ["flight_number", "date"],
    },
}
_PASSENGERS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"first_name": _S, "last_name": _S, "dob": _DATE},
        "required": ["first_name", "last_name", "dob"],
    },
}
_PAYMENTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"payment_id": _PAY_ID, "amount": _INT},
        "required": ["payment_id", "amount"],
    },
}


_TOOLS = [
    DomainTool.confirmed(
        book_reservation,
        {
            "user_id": _USER,
            "origin": _AIRPORT,
            "destination": _AIRPORT,
            "flight_type": {"type": "string", "description": "'round_trip' or 'one_way'"},
            "cabin": _CABIN,
            "flights": _FLIGHTS,
            "passengers": _PASSENGERS,
            "payment_methods": _PAYMENTS,
            "total_baggages": _INT,
            "nonfree_baggages": _INT,
            "insurance": {"type": "string", "description": "'yes' or 'no'"},
        },
    ),
    CALCULATE,
    DomainTool.confirmed(cancel_reservation, {"reservation_id": _RES}),
    DomainTool.of(get_reservation_details, "read", {"reservation_id": _RES}),
    DomainTool.of(get_user_details, "read", {"user_id": _USER}),
    DomainTool.of(get_flight_status, "read", {"flight_number": _S, "date": _DATE}),
    DomainTool.of(list_all_airports, "read", {}),
    DomainTool.of(search_direct_flight, "read", {"origin": _AIRPORT, "destination": _AIRPORT, "date": _DATE}),
    DomainTool.of(search_onestop_flight, "read", {"origin": _AIRPORT, "destination": _AIRPORT, "date": _DATE}),
    DomainTool.of(send_certificate, "write", {"user_id": _USER, "amount": _INT}),
    TRANSFER_TO_HUMAN_AGENTS,
    DomainTool.confirmed(
        update_reservation_baggages,
        {"reservation_id": _RES, "total_baggages": _INT, "nonfree_baggages": _INT, "payment_id": _PAY_ID},
    ),
    DomainTool.confirmed(
        update_reservation_flights,
        {"reservation_id": _RES, "cabin": _CABIN, "flights": _FLIGHTS, "payment_id": _PAY_ID},
    ),
    DomainTool.confirmed(update_reservation_passengers, {"reservation_id": _RES, "passengers": _PASSENGERS}),
]

DOMAIN = Domain("airline", "AirlineTools", {t.name: t for t in _TOOLS}, normalise=_normalise)

"""The planner's catch-up rules before s46, on one planner instance (a benchmark aid): the catch-up spread over
the whole expected output (CATCH_UP_LOOKAHEAD unbounded) and priced at a smoothed rate per token
(seconds over tokens, 0.2 weight per new sample), as step_costs.py did at 279dc01."""


def make_old(planner) -> None:
    planner.CATCH_UP_LOOKAHEAD = 10**9
    costs = planner.costs
    state = {"rate": 0.0}

    def observe_catch_up(tokens: int, seconds: float) -> None:
        per_token = seconds / tokens
        old = state["rate"]
        state["rate"] = per_token if old == 0.0 else 0.8 * old + 0.2 * per_token

    costs.observe_catch_up = observe_catch_up
    costs.catch_up_time = lambda tokens: tokens * state["rate"] if tokens > 0 else 0.0

"""The WebShop environment: shopping tasks behind the same rollout, memory policies, trainer and
evaluation as QA (mem1_core.rollout.environment).

A task is one goal of a shop (mem1_core.webshop.catalog): its prompt is the instruction and the
search page; each turn the agent writes MEM1's format, `<IS> … </IS>` then one action, and the
environment answers with the next page (mem1_core.webshop.pages, written as
mem1_core.webshop.views writes it) as the `<info>` block. The episode ends at `[Buy Now]`,
with WebShop's reward for what was bought (goal.py's formula, mem1_core.webshop.reward), or
when the turn budget is spent, with 0.

The tag. The action is written in `<query> … </query>`: `<query>search[red running
shoes]</query>`, `<query>click[B0ABCDEF12]</query>`, `<query>click[Buy Now]</query>`. Why
`<query>` and not a new `<action>` tag: it already is "what the agent asks of the environment,
answered in `<info>`", so the tiny tokenizer's eight special tags, the stop rule, the tag codec
and MEM1's carried `<IS><query>` slice all work unchanged, and a policy trained on one domain
reads the other's format; a ninth tag would be a new special token, i.e. a new tokenizer and a
new base model. WebShop has no answer: a turn that writes `<answer>` is invalid.

Invalid turns. A turn that breaks MEM1's format, writes `<answer>`, writes a query that is not
`search[…]` or `click[…]`, or clicks a value the page does not show is invalid, and the page
stays as it was. What else it costs is `format_error`:
- `retry` (the default): it counts as a format error, and the `<info>` says why and shows the
  page again (MEM1 pruned the last one from the context);
- `end` (MEM1's WebShop setting): a broken tag format (MEM1's rule, or an `<answer>` where the
  action belongs) ends the episode with reward -1, as MEM1's rollout does; an action the page
  does not offer changes nothing, as in WebShop's text environment, and the same page is the
  observation.

State. Where a trajectory stands (its page, the selected options) is a function of its valid
actions: `page(traj)` replays them from the search page, searches cached, so nothing but the
trajectory holds an episode's state (a trajectory read back from Parquet can be replayed).

Tasks. `shop_tasks(shop, name)` makes a shop's goals into rollout tasks with ids `name/i`;
the environment holds shops by name (a run's training shop and its held-out shop), so one
environment serves both splits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from mem1_core.data.prompts import INFO_CLOSE, INFO_OPEN, IS_CLOSE, IS_OPEN, QUERY_CLOSE, QUERY_OPEN
from mem1_core.models.tags import TagCodec
from mem1_core.rollout.environment import Environment
from mem1_core.rollout.loop import Task
from mem1_core.trajectory.record import Action, Trajectory
from mem1_core.webshop.catalog import Goal, Product, Shop
from mem1_core.webshop.pages import BUY_NOW, SEARCH, Page, apply, parse_action
from mem1_core.webshop.reward import OPTION_MATCHES, noun_parser, webshop_reward
from mem1_core.webshop.search import ShopSearch, shop_search
from mem1_core.webshop.views import OBSERVATIONS, first_observation, observe

WEBSHOP_INSTRUCTIONS = (
    f"You are shopping in WebShop. Each turn write {IS_OPEN} {IS_CLOSE}, your only memory: keep "
    f"what you still need. Then one action in {QUERY_OPEN} {QUERY_CLOSE}: search[keywords], or "
    f"click[value] on a [value] the page shows. Pages come in {INFO_OPEN} {INFO_CLOSE}. Choose "
    f"the options the instruction asks for, then click[{BUY_NOW}]."
)
FORMAT_ERRORS = ("retry", "end")
"""What a broken turn costs (module docstring)."""
FORMAT_ERROR_REWARD = -1.0
"""MEM1's reward for a turn that breaks the tag format, under `format_error="end"`."""

FORMAT_HINT = (
    f"[FORMAT] Invalid turn. Write {IS_OPEN} state {IS_CLOSE} then {QUERY_OPEN} search[keywords] "
    f"{QUERY_CLOSE} or {QUERY_OPEN} click[value] {QUERY_CLOSE}."
)

NO_ANSWER = f"WebShop has no <answer>: buy with {QUERY_OPEN}click[{BUY_NOW}]{QUERY_CLOSE}"
NOT_AN_ACTION = "the action must be search[keywords] or click[value]"


def webshop_prompt(instruction: str, observation: str = "lines") -> str:
    """The task prompt: how to act, then the first observation: the instruction and the search
    page (`lines`), or MEM1's first state (`webshop`)."""
    if not instruction.strip():
        raise ValueError("a WebShop task needs a non-empty instruction")
    if observation == "lines":
        first = f"Instruction: {instruction.strip()}\n{first_observation(observation, '')}"
    else:
        first = first_observation(observation, instruction.strip())
    return f"{WEBSHOP_INSTRUCTIONS}\n{first}\n"


def shop_tasks(
    shop: Shop, name: str, limit: int | None = None, observation: str = "lines"
) -> list[Task]:
    """The shop's goals as rollout tasks, in the shop's order: id `name/i`, the instruction as
    the one question, the target's asin as its gold (what a trajectory records as its gold)."""
    if "/" in name:
        raise ValueError(f"a shop name may not contain '/': {name!r}")
    goals = shop.goals[:limit] if limit is not None else shop.goals
    return [
        Task(
            f"{name}/{i}",
            webshop_prompt(g.instruction, observation),
            [g.instruction],
            [[g.asin]],
            [],
        )  # fmt: skip
        for i, g in enumerate(goals)
    ]


def purchase_text(asin: str, selected: Sequence[tuple[str, str]]) -> str:
    """What a trajectory records as its answer when it buys: the item's asin and its selected
    options, `B0ABCDEF12 (size: 9, color: red)`."""
    chosen = ", ".join(f"{g}: {v}" for g, v in selected)
    return f"{asin} ({chosen})" if chosen else asin


def purchase(answer: str | None) -> tuple[str, str] | None:
    """(asin, the selected options as `purchase_text` wrote them, "" for none) of a
    trajectory's answer; None where it bought nothing."""
    if answer is None:
        return None
    asin, _, chosen = answer.partition(" (")
    return asin, chosen.removesuffix(")")


class WebShopEnvironment(Environment):
    """Shops by name; pages, actions and the reward of WebShop (module docstring)."""

    kind = "webshop"

    def __init__(
        self,
        tokenizer,
        shops: Mapping[str, Shop],
        *,
        results_per_page: int = 10,
        max_results: int = 50,
        codec: TagCodec | None = None,
        chat_template: bool = False,
        nouns: str = "standin",
        option_match: str = "webshop",
        observation: str = "lines",
        format_error: str = "retry",
    ):
        super().__init__(tokenizer, codec, chat_template=chat_template)
        if not shops:
            raise ValueError("the WebShop environment needs at least one shop")
        if not 1 <= results_per_page <= max_results:
            raise ValueError("need 1 <= results_per_page <= max_results")
        for name, value, allowed in (
            ("option_match", option_match, OPTION_MATCHES),
            ("observation", observation, OBSERVATIONS),
            ("format_error", format_error, FORMAT_ERRORS),
        ):
            if value not in allowed:
                raise ValueError(f"env.{name}={value!r}: use one of {', '.join(allowed)}")
        noun_parser(nouns)  # a parser that cannot load stops the run here, in one line
        self.shops = dict(shops)
        self.per_page = results_per_page
        self.max_results = max_results
        self.nouns = nouns
        self.option_match = option_match
        self.observation = observation
        self.format_error = format_error
        self._search: dict[str, ShopSearch] = {}
        self._results: dict[tuple[str, str], list[str]] = {}

    # ---- a task's shop, goal and page -----------------------------------------------------

    def shop_of(self, task_id: str) -> tuple[str, Shop]:
        name, _, _ = task_id.rpartition("/")
        if name not in self.shops:
            raise KeyError(f"task {task_id!r}: no shop named {name!r} (have {sorted(self.shops)})")
        return name, self.shops[name]

    def goal(self, task_id: str) -> Goal:
        _, shop = self.shop_of(task_id)
        return shop.goals[int(task_id.rpartition("/")[2])]

    def search(self, shop_name: str, keywords: str) -> list[str]:
        """The shop's top `max_results` asins for `keywords` (cached: a replay searches again)."""
        key = (shop_name, keywords.lower())
        if key not in self._results:
            if shop_name not in self._search:
                self._search[shop_name] = shop_search(self.shops[shop_name])
            self._results[key] = self._search[shop_name].search(keywords, self.max_results)
        return self._results[key]

    def _rules(self, task_id: str) -> tuple[Callable[[str], Product], Callable[[str], list[str]]]:
        name, shop = self.shop_of(task_id)
        return shop.product, lambda kw: self.search(name, kw)

    def page(self, traj: Trajectory, upto: int | None = None) -> Page:
        """Where the trajectory stands after its first `upto` turns (all by default): its
        valid actions replayed from the search page."""
        product_of, search = self._rules(traj.task_id)
        page = Page()
        for turn in traj.turns[:upto]:
            if turn.action in (Action.QUERY, Action.CLICK) and turn.query:
                verb, arg = parse_action(turn.query) or ("", "")
                outcome = apply(page, verb, arg, product_of, search, self.per_page)
                if outcome is not None:
                    page = outcome.page
        return page

    def render(self, traj: Trajectory, page: Page) -> str:
        """The page as the agent reads it, in the environment's observation format."""
        product_of, _ = self._rules(traj.task_id)
        instruction = self.goal(traj.task_id).instruction
        return observe(self.observation, page, product_of, self.per_page, instruction)

    # ---- the step -------------------------------------------------------------------------

    def step(self, trajs: list[Trajectory]) -> None:
        for tr in trajs:
            self._step_one(tr)

    def _step_one(self, tr: Trajectory) -> None:
        turn = tr.turns[-1]
        parsed = self.parse(turn.gen_ids, turn.finish)
        turn.gen_text = self.tok.decode(turn.gen_ids)
        error, action = parsed.error, None
        if parsed.action is Action.ANSWER:
            error = NO_ANSWER
        if error is not None and self.format_error == "end":  # MEM1: the episode ends, -1
            turn.action, turn.format_error = Action.INVALID, error
            tr.score, tr.em, tr.f1, tr.done = (
                FORMAT_ERROR_REWARD,
                [0.0],
                [FORMAT_ERROR_REWARD],
                True,
            )
            return
        if parsed.action is Action.QUERY:
            action = parse_action(parsed.text or "")
            if action is None:
                error = NOT_AN_ACTION
        page = self.page(tr, upto=-1)
        outcome = None
        if action is not None:
            product_of, search = self._rules(tr.task_id)
            outcome = apply(page, *action, product_of, search, self.per_page)
            if outcome is None:
                error = f"{action[0]}[{action[1]}] is not on this page"
        if outcome is None:
            turn.action, turn.format_error = Action.INVALID, error
        else:
            verb, arg = action
            turn.action = Action.QUERY if verb == SEARCH else Action.CLICK
            turn.query = f"{verb}[{arg}]"
            page = outcome.page
        if outcome is not None and outcome.bought is not None:
            self._buy(tr, outcome.bought, page)
        elif self.at_budget(tr):  # the budget is spent before a purchase: reward 0
            tr.score, tr.em, tr.f1, tr.done = 0.0, [0.0], [0.0], True
        elif outcome is None and self.format_error == "retry":
            self.set_info(tr, f"{FORMAT_HINT} ({error})\n{self.render(tr, page)}")
        else:
            self.set_info(tr, self.render(tr, page))

    def _buy(self, tr: Trajectory, product: Product, page: Page) -> None:
        """The episode's end: WebShop's reward for the product, its selected options and its
        price. EM records success (reward 1) and F1 the reward, the evaluation's two columns."""
        r = webshop_reward(
            self.goal(tr.task_id),
            product,
            page.options,
            product.price,
            nouns=self.nouns,
            option_match=self.option_match,
        )
        tr.answer = purchase_text(product.asin, page.selected)
        tr.score, tr.em, tr.f1, tr.done = r.total, [float(r.success)], [r.total], True

    def scripted_teacher(self, tasks: list, cfg, *, lapses: bool = True, seed_offset: int = 0):
        """The WebShop teacher (mem1_core.webshop.teacher): it plays any of the shops' goals;
        it has no deliberate lapses (the QA teacher's knobs do not apply)."""
        from mem1_core.webshop.teacher import WebShopTeacher

        return WebShopTeacher(self.tok, self)

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        """The paper's WebShop columns: average reward ×100, success rate (reward 1), turns
        used, format errors per task, and how many bought anything."""
        if not trajs:
            return {}
        n = len(trajs)
        return {
            "reward_x100": 100.0 * sum(t.reward for t in trajs) / n,
            "success_rate": sum(t.reward == 1.0 for t in trajs) / n,
            "turns": sum(len(t.turns) for t in trajs) / n,
            "format_errors": sum(t.format_errors for t in trajs) / n,
            "bought": sum(t.answer is not None for t in trajs) / n,
        }

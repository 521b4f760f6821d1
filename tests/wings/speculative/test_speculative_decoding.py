"""Speculative decoding (DESIGN.md sections 4 and 9): it must change speed, never the output.

- Greedy speculative output equals plain greedy output token for token (fp32), for the int8
  self-draft and prompt lookup, k in {1, 2, 4, 8}, alone and in a batch; on tiny random models
  and on the embedded default model. Batching changes matmul shapes, so the only divergence
  accepted is an exact near-tie (``assert_same_or_near_tie``), as in test_invariance.py.
- A draft identical to the target accepts every draft: k + 1 tokens per step but where
  max_tokens or max_model_len cuts it.
- The rejection sampler reproduces the target distribution (chi-square tests on a toy
  vocabulary), and the engine's sampled speculative output follows the target's joint law.
- Coupled verification (what the engine runs for sampled requests) emits the target's keyed
  draws: a seeded request gives plain seeded sampling's tokens, whatever the pool, preemption or
  batch-mates, with prompt lookup and with the int8 self-draft.
- Acceptance figures, counted over the tokens a request emits (drafts accepted past its stop are
  dropped, and not counted), and the serving figures of multi-token emissions (TPOT < ITL).
- KV rollback keeps the block accounting intact after every step, for the target and for the
  draft model's own cache, under preemption, chunked prefill, prefix caching and sampling.
- Bad configurations are refused; prompt lookup finds the latest, longest match.

Statistical tests use fixed seeds, so they are deterministic; their docstrings state the odds
that a correct implementation would fail them for a random seed.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import (
    assert_same_or_near_tie,
    chat_ids,
    hf_logits,
    hf_next_logits,
    make_engine,
    random_prompts,
    tiny_hf_config,
    tiny_pair,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pytest import approx

from minieng import EngineConfig, LLMEngine, SamplingParams
from minieng.core import engine_core
from minieng.wings.speculative.drafters import DraftModelDrafter, PromptLookupDrafter
from minieng.wings.speculative.speculator import verify
from minieng.core.outputs import append_tokens
from minieng.core.sampling import KeyedRandom, probabilities, race
from minieng.core.sequence import Sequence
from minieng.model.loader import check_same_tokenizer
from minieng.wings.speculative.verification import verify_coupled, verify_greedy
from minieng.lab.speculative import expected_tokens_per_step
from minieng.measure.metrics import acceptance_metrics, request_metrics, serving_metrics
from minieng.core.llama import Linear
from minieng.model.loader import LoadedModel
from minieng.wings.quantization.quantization import model_quantization, quantize_model
from minieng.units import cdiv

VOCAB = 300  # the tiny Llama's
KS = (1, 2, 4, 8)
METHODS = {
    # the quantized self-draft: W8A8, the less accurate CPU scheme, so drafts are rejected too
    "quantized": dict(speculative_method="draft", draft_quantization="w8a8"),
    "ngram": dict(speculative_method="ngram"),  # prompt lookup
    "self": dict(speculative_method="draft"),  # the target's own weights: accepts every draft
}
ALPHA = 1e-4  # per chi-square test: the odds a correct sampler fails it, for a random seed


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Two cores shared with other test runs: one intra-op thread is much faster here (module
    scope, so the module's fixtures that generate or quantize run under it too)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def spec_engine(loaded: LoadedModel, method: str, k: int, **overrides) -> LLMEngine:
    return make_engine(loaded, num_speculative_tokens=k, **METHODS[method], **overrides)


def accepted_and_proposed(engine: LLMEngine, since: int = 0) -> tuple[int, int]:
    rows = engine.spec_records[since:]
    return sum(r[3] for r in rows), sum(r[2] for r in rows)


# -- chi-square without scipy ----------------------------------------------------------------------


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df), integer df (closed forms: Poisson sum for even df,
    erfc plus a half-integer series for odd df)."""
    h = x / 2
    if df % 2 == 0:
        term = total = 1.0
        for j in range(1, df // 2):
            term *= h / j
            total += term
        return math.exp(-h) * total
    total, term = 0.0, math.sqrt(h) / math.gamma(1.5)
    for j in range((df - 1) // 2):
        total += term
        term *= h / (j + 1.5)
    return math.erfc(math.sqrt(h)) + math.exp(-h) * total


def chi_square_p(counts: dict, probs: dict, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Goodness of fit of observed ``counts`` (outcome -> n) to ``probs`` (outcome -> p).

    An outcome with probability 0 that was observed fails at once (p-value 0). Cells expected
    below ``min_expected`` are pooled. Returns (p-value, statistic, degrees of freedom).
    """
    n = sum(counts.values())
    if any(probs.get(o, 0.0) <= 0 for o in counts):
        return 0.0, math.inf, 0
    cells, pool = [], [0.0, 0]
    for o, p in sorted(probs.items(), key=lambda item: -item[1]):
        if p <= 0:
            continue
        if n * p >= min_expected:
            cells.append((n * p, counts.get(o, 0)))
        else:
            pool[0] += n * p
            pool[1] += counts.get(o, 0)
    if pool[0] > 0:
        cells.append(tuple(pool))
    stat = sum((obs - exp) ** 2 / exp for exp, obs in cells)
    df = len(cells) - 1
    return (chi2_sf(stat, df) if df > 0 else 1.0), stat, df


def test_chi2_sf_matches_tabulated_critical_values():
    # chi-square quantiles at 1 - 1e-4 (and 1 - 1e-3 for df 4), from standard tables
    for x, df, tail in [
        (15.137, 1, 1e-4),
        (18.421, 2, 1e-4),
        (21.108, 3, 1e-4),
        (23.513, 4, 1e-4),
        (25.745, 5, 1e-4),
        (31.828, 8, 1e-4),
        (18.467, 4, 1e-3),
    ]:
        assert chi2_sf(x, df) == approx(tail, rel=2e-3), (x, df)


# -- 3. the rejection sampler -----------------------------------------------------------------------

TOY_V = 5


def toy_dists(seed: int, n: int) -> torch.Tensor:
    """``n`` distributions over 5 tokens, far from uniform yet each probability >= ~1%."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, TOY_V, generator=g, dtype=torch.float64) ** 2 + 0.05
    return (x / x.sum(-1, keepdim=True)).float()


def as_dict(t: torch.Tensor) -> dict[int, float]:
    return {i: float(v) for i, v in enumerate(t.tolist())}


def count(tokens) -> dict[int, int]:
    out: dict[int, int] = {}
    for t in tokens:
        out[t] = out.get(t, 0) + 1
    return out


def run_verifier(p: torch.Tensor, q: torch.Tensor, n: int, seed: int) -> list[list[int]]:
    """``n`` verifications of k = len(q) drafts, each x_i ~ q_i drawn afresh (independent draws)."""
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=gen) for i in range(len(q))], 1)
    return [verify_sampled(row, q, p, gen) for row in drafts.tolist()]


def test_rejection_sampling_k1_emits_the_target_distribution():
    """x ~ q, then accept or resample: the emitted token follows p, and the acceptance rate is
    sum_x min(p(x), q(x)); the bonus token after an accepted draft follows p_2. False-failure odds
    for a random seed: two chi-square tests at 1e-4 and a z-test at 7e-6 (|z| > 4.5): ~2e-4."""
    p, q = toy_dists(1, 2), toy_dists(2, 1)
    n = 20_000
    outs = run_verifier(p, q, n, seed=7)
    assert all(1 <= len(o) <= 2 for o in outs)
    pval, stat, df = chi_square_p(count(o[0] for o in outs), as_dict(p[0]))
    assert pval > ALPHA, f"first token does not follow p: chi2={stat:.1f}, df={df}"
    # acceptance: the first emitted token is the draft and a second (bonus) token follows
    accepted = sum(len(o) == 2 for o in outs)
    beta = float(torch.minimum(p[0], q[0]).sum())
    z = (accepted - n * beta) / math.sqrt(n * beta * (1 - beta))
    assert abs(z) < 4.5, f"acceptance rate {accepted / n:.4f}, expected {beta:.4f}"
    # the bonus token after an accepted draft follows p_2
    pval, stat, df = chi_square_p(count(o[1] for o in outs if len(o) == 2), as_dict(p[1]))
    assert pval > ALPHA, f"bonus token does not follow p_2: chi2={stat:.1f}, df={df}"


def test_rejection_sampling_k2_first_second_and_bonus_tokens():
    """k = 2: the first token follows p_1; given the first draft was accepted, the second follows
    p_2; given both were, the bonus follows p_3; P(both accepted) = beta_1 * beta_2.
    Three chi-square tests at 1e-4 and one z-test at 7e-6: false failure ~3e-4 for a random seed."""
    p, q = toy_dists(3, 3), toy_dists(4, 2)
    n = 20_000
    outs = run_verifier(p, q, n, seed=11)
    assert all(1 <= len(o) <= 3 for o in outs)
    for pos in range(3):
        tokens = [o[pos] for o in outs if len(o) > pos]
        assert len(tokens) > 2_000
        pval, stat, df = chi_square_p(count(tokens), as_dict(p[pos]))
        assert pval > ALPHA, (
            f"token {pos} (given {pos} accepted drafts) does not follow p_{pos + 1}: "
            f"chi2={stat:.1f}, df={df}, n={len(tokens)}"
        )
    both = sum(len(o) == 3 for o in outs)
    beta = float(torch.minimum(p[0], q[0]).sum() * torch.minimum(p[1], q[1]).sum())
    z = (both - n * beta) / math.sqrt(n * beta * (1 - beta))
    assert abs(z) < 4.5, f"all-accepted rate {both / n:.4f}, expected {beta:.4f}"


def test_rejection_sampling_q_equal_p_accepts_all_and_bonus_follows_last_p():
    """q == p: every draft is accepted (u * q <= p for u < 1), so each verification emits k + 1
    tokens, the drafts unchanged, then the bonus ~ p_{k+1}. False failure 1e-4 (chi-square)."""
    p = toy_dists(5, 3)
    q = p[:2].clone()
    gen = torch.Generator().manual_seed(3)
    n = 8_000
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=gen) for i in range(2)], 1)
    bonus = []
    for row in drafts.tolist():
        out = verify_sampled(row, q, p, gen)
        assert out[:2] == row and len(out) == 3
        bonus.append(out[2])
    pval, stat, df = chi_square_p(count(bonus), as_dict(p[2]))
    assert pval > ALPHA, f"bonus token does not follow p_3: chi2={stat:.1f}, df={df}"


def test_prompt_lookup_verification_through_the_runner_emits_the_target_distribution():
    """Prompt lookup proposes a fixed token x; ``model_runner.verify`` (coupled) accepts it when the
    target's keyed draw is x, with probability p(x), else emits that draw: the first token follows
    p, one request seed per verification. False failure for a random seed: 1e-4 (chi-square) +
    7e-6 (z-test)."""
    p = toy_dists(6, 2)
    logits = p.log()  # probabilities(logits, temperature 1) == p
    params = SamplingParams(temperature=1.0)
    n, draft = 20_000, 2
    first = []
    for i in range(n):
        seq = Sequence("r", [0], params, 0.0, KeyedRandom(5_000 + i))
        seq.spec_token_ids = [draft]
        out = verify(seq, logits)
        assert 1 <= len(out) <= 2 and (len(out) == 2) == (out[0] == draft)
        first.append(out[0])
    pval, stat, df = chi_square_p(count(first), as_dict(p[0]))
    assert pval > ALPHA, f"first token does not follow p with a one-hot q: chi2={stat:.1f}, df={df}"
    accepted = first.count(draft)
    beta = float(p[0, draft])
    assert abs(accepted - n * beta) / math.sqrt(n * beta * (1 - beta)) < 4.5


def test_rejection_sampling_is_reproducible_with_the_generator():
    p, q = toy_dists(8, 5), toy_dists(9, 4)
    runs = [run_verifier(p, q, 300, seed=21) for _ in range(2)]
    assert runs[0] == runs[1]


def test_one_hot_target_makes_sampled_verification_greedy():
    """With p one-hot (the greedy limit) the sampled rule must give verify_greedy's answer."""
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        k = int(torch.randint(1, 6, (), generator=g))
        best = torch.randint(0, TOY_V, (k + 1,), generator=g)
        drafts = torch.where(torch.rand(k, generator=g) < 0.7, best[:k], torch.randint(0, TOY_V, (k,), generator=g))
        p = torch.nn.functional.one_hot(best, TOY_V).float()
        q = toy_dists(int(torch.randint(0, 1000, (), generator=g)), k)
        assert verify_sampled(drafts.tolist(), q, p, g) == verify_greedy(drafts.tolist(), p)


def test_coupled_verification_emits_the_target_draws():
    """``verify_coupled`` emits the target's keyed draws race(p_i, E_i) themselves: the drafts up to
    the first that differs from the draw at its position, then that draw. So a draft model racing
    q_i with the same noise, any fixed draft (prompt lookup) or no draft at all give the tokens
    plain sampling gives."""
    g = torch.Generator().manual_seed(1)
    agreed = 0
    for trial in range(300):
        k = int(torch.randint(0, 6, (), generator=g))
        p, q = toy_dists(2 * trial, k + 1), toy_dists(2 * trial + 1, k)
        rng = KeyedRandom(trial)
        noise = torch.stack([rng.exponentials(j, TOY_V) for j in range(k + 1)])
        draws = race(p, noise).tolist()
        for drafts in (race(q, noise[:k]).tolist(), torch.randint(0, TOY_V, (k,), generator=g).tolist(), draws[:k]):
            out = verify_coupled(drafts, p, noise)
            n = next((i for i, (d, t) in enumerate(zip(drafts, draws)) if d != t), k)
            assert out == draws[: n + 1], (drafts, draws, out)
        agreed += sum(a == b for a, b in zip(race(q, noise[:k]).tolist(), draws))
    assert agreed > 0


def greedy_logits(best: list[int]) -> torch.Tensor:
    """Logits [len(best), 6] whose row argmaxes are ``best``, with runner-up values close by."""
    logits = torch.linspace(0, 1, 6).repeat(len(best), 1)
    for i, b in enumerate(best):
        logits[i, b] = 2.0
    return logits


@pytest.mark.parametrize(
    "drafts,best,expected",
    [
        ([3, 1, 4], [3, 1, 4, 1], [3, 1, 4, 1]),  # all accepted, then the bonus argmax
        ([3, 2, 4], [3, 1, 4, 1], [3, 1]),  # second rejected: the target's token replaces it
        ([0, 1, 4], [3, 1, 4, 1], [3]),  # first rejected: one token, the target's
        ([5], [5, 0], [5, 0]),
        ([5], [4, 0], [4]),
        ([], [2], [2]),  # nothing proposed: a plain greedy step
        ([2, 2, 2, 2], [2, 2, 5, 2, 2], [2, 2, 5]),  # a later match after a rejection does not count
    ],
)
def test_verify_greedy_hand_worked(drafts, best, expected):
    assert verify_greedy(drafts, greedy_logits(best)) == expected


# -- 7. prompt lookup ----------------------------------------------------------------------------------


def test_prompt_lookup_latest_match_wins():
    d = PromptLookupDrafter(ngram_max=2)
    tokens = [1, 2, 3, 9, 1, 2, 4, 5, 1, 2]  # [1, 2] occurs at 0 and at 4
    assert d.lookup(tokens, 3) == [4, 5, 1]
    assert d.lookup(tokens, 1) == [4]


def test_prompt_lookup_longest_n_first():
    d = PromptLookupDrafter(ngram_max=3)
    # the 3-gram [5, 6, 7] matches at 0 (-> 8, 7, 9); the 1-gram [7] matches later, at 4 (-> 9, 5, 6)
    tokens = [5, 6, 7, 8, 7, 9, 5, 6, 7]
    assert d.lookup(tokens, 3) == [8, 7, 9]
    assert PromptLookupDrafter(ngram_max=1).lookup(tokens, 3) == [9, 5, 6]
    # with no 3-gram match the 2-gram is tried before the 1-gram
    tokens = [4, 6, 7, 1, 7, 2, 5, 6, 7]  # [6, 7] at 1 (-> 1); [7] latest at 4 (-> 2)
    assert d.lookup(tokens, 2) == [1, 7]


def test_prompt_lookup_no_match_and_edges():
    d = PromptLookupDrafter(ngram_max=3)
    assert d.lookup([1, 2, 3, 4], 4) == []  # the last token never occurred before
    assert d.lookup([7], 3) == []  # nothing before the tail
    assert d.lookup([], 3) == []
    assert d.lookup([1, 2, 1], 0) == []  # k = 0 proposes nothing
    assert d.lookup([1, 2, 1, 2], 5) == [1, 2]  # fewer tokens follow the match than k
    assert d.lookup([3, 3, 3], 2) == [3]  # overlapping match: [3, 3] at 0 -> what follows it
    # ngram_min: a 1-gram match is not enough when n must be >= 2
    assert PromptLookupDrafter(ngram_max=3, ngram_min=2).lookup([1, 5, 2, 5], 2) == []
    assert PromptLookupDrafter(ngram_max=3, ngram_min=1).lookup([1, 5, 2, 5], 2) == [2, 5]


def test_prompt_lookup_propose_batches():
    d = PromptLookupDrafter(ngram_max=2)
    a = Sequence("a", [1, 2, 3, 1], greedy(4), 0.0)
    b = Sequence("b", [4, 5, 6], greedy(4), 0.0)
    b.output_token_ids = [4]  # the lookup covers output tokens too
    assert d.propose([a, b], [2, 3]) == [[2, 3], [5, 6, 4]]


# -- 6. bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(num_speculative_tokens=-1, speculative_method="draft"), "num_speculative_tokens=-1"),
        (dict(num_speculative_tokens=2), "num_speculative_tokens=2"),  # no method
        (dict(speculative_method="eagle", num_speculative_tokens=2), "speculative_method='eagle'"),
        (
            dict(speculative_method="draft", num_speculative_tokens=2, draft_quantization="int3"),
            "draft_quantization='int3'",
        ),
        (dict(speculative_method="ngram", num_speculative_tokens=2, ngram_max=0), "ngram_max=0"),
    ],
)
def test_bad_speculative_config(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


def test_prompt_lookup_bad_sizes():
    with pytest.raises(ValueError, match="ngram"):
        PromptLookupDrafter(ngram_max=2, ngram_min=3)
    with pytest.raises(ValueError, match="ngram"):
        PromptLookupDrafter(ngram_max=2, ngram_min=0)


def test_method_without_k_runs_no_drafter(tiny_llama):
    engine = make_engine(tiny_llama[1], speculative_method="draft", num_speculative_tokens=0)
    assert engine.drafter is None
    engine.generate([[1, 2, 3]], greedy(4))
    assert engine.spec_records == []


class FakeTokenizer:
    """A stand-in tokenizer: each id decodes to one letter (id % 26); ``get_vocab`` is settable."""

    def __init__(self, vocab: dict[str, int] | None = None):
        self.vocab = vocab or {}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


@pytest.fixture(scope="module")
def tiny_other_vocab():
    """(transformers model, LoadedModel) of a tiny Llama whose vocabulary has 320 tokens."""
    cfg = tiny_hf_config("llama")
    cfg.vocab_size = 320
    return tiny_pair(cfg, seed=1)


def test_check_same_tokenizer(tiny_llama, tiny_other_vocab):
    target, other = tiny_llama[1], tiny_other_vocab[1]
    with pytest.raises(ValueError, match="vocabulary"):
        check_same_tokenizer(target, other)
    check_same_tokenizer(target, target)  # the same model is fine

    def same_size(vocab):
        return LoadedModel(target.model, FakeTokenizer(vocab), target.hf_config, set(), None)

    with pytest.raises(ValueError, match="tokenizer"):
        check_same_tokenizer(same_size({"a": 0, "b": 1}), same_size({"a": 1, "b": 0}))
    check_same_tokenizer(same_size({"a": 0}), same_size({"a": 0}))


@pytest.fixture(scope="module")
def tiny_draft_dirs(tmp_path_factory, tiny_other_vocab):
    """Hugging Face directories of tiny drafts: another random Llama of the target's vocabulary,
    and one of a different vocabulary."""
    from helpers import tiny_hf_model

    root = tmp_path_factory.mktemp("drafts")
    same = tiny_hf_model(tiny_hf_config("llama"), seed=1)
    same.save_pretrained(root / "same_vocab")
    tiny_other_vocab[0].save_pretrained(root / "other_vocab")
    return {"same": str(root / "same_vocab"), "other": str(root / "other_vocab")}


def test_engine_refuses_a_draft_model_of_another_vocabulary(tiny_llama, tiny_draft_dirs):
    with pytest.raises(ValueError, match="vocabulary"):
        make_engine(
            tiny_llama[1], speculative_method="draft", num_speculative_tokens=2, draft_model=tiny_draft_dirs["other"]
        )


def test_a_draft_model_the_device_cannot_run_is_refused_before_its_weights_load(
    tiny_llama, tiny_draft_dirs, monkeypatch
):
    """int4 has no CPU kernel: the separate draft's scheme is refused from its config alone."""
    import minieng.engine.model_loading as draft_module

    def no_load(*args, **kwargs):
        raise AssertionError("the draft's weights were read before its refusal")

    monkeypatch.setattr(draft_module, "load_model", no_load)
    with pytest.raises(ValueError, match="int4"):
        make_engine(
            tiny_llama[1],
            speculative_method="draft",
            num_speculative_tokens=2,
            draft_model=tiny_draft_dirs["same"],
            draft_quantization="int4",
        )


def test_a_separate_draft_is_refused_before_the_target_loads(tiny_draft_dirs, monkeypatch):
    """An engine that loads its target: the draft's refusal (int4 has no CPU kernel) comes before any
    weight of either model is read."""
    from minieng import EngineConfig, LLMEngine
    from minieng.engine import model_loading

    def no_load(*args, **kwargs):
        raise AssertionError("the target's weights were read before the draft's refusal")

    monkeypatch.setattr(model_loading, "load_ranks", no_load)
    config = EngineConfig(
        model=tiny_draft_dirs["same"], device="cpu", num_kv_blocks=64, speculative_method="draft",
        num_speculative_tokens=2, draft_model=tiny_draft_dirs["same"], draft_quantization="int4",
    )  # fmt: skip
    with pytest.raises(ValueError, match="int4"):
        LLMEngine(config)


def test_a_different_draft_model_keeps_greedy_output(tiny_llama, tiny_draft_dirs):
    """A poor draft (another random model) costs speed, never correctness."""
    hf, loaded = tiny_llama
    prompts = random_prompts([5, 30, 12], VOCAB, seed=8)
    ref = [make_engine(loaded).generate([p], greedy(20))[0].token_ids for p in prompts]
    engine = make_engine(
        loaded, speculative_method="draft", num_speculative_tokens=3, draft_model=tiny_draft_dirs["same"]
    )
    outs = engine.generate(prompts, greedy(20))
    accepted, proposed = accepted_and_proposed(engine)
    assert proposed > 0 and accepted < proposed, "the random draft should be rejected sometimes"
    for p, r, o in zip(prompts, ref, outs):
        assert_same_or_near_tie(r, o.token_ids, p, hf_next_logits(hf), what="different draft model")


def test_int8_quantization_refuses_a_device_without_a_kernel(tiny_llama):
    model = copy.deepcopy(tiny_llama[1].model).to("meta")
    with pytest.raises(ValueError, match="does not run on meta"):
        quantize_model(model, "int8")


def test_int8_self_draft_quantizes_a_copy(tiny_llama):
    """The quantized self-draft replaces every linear layer and the LM head, in a copy: the
    target keeps its fp32 weights."""
    hf, loaded = tiny_llama
    draft = quantize_model(loaded.model, "int8")
    assert draft is not loaded.model and model_quantization(draft) == ("int8", None)
    assert not any(isinstance(m, (torch.nn.Linear, Linear)) for m in draft.modules()), "a layer stayed fp32"
    assert any(isinstance(m, (torch.nn.Linear, Linear)) for m in loaded.model.modules())
    engine = make_engine(loaded, speculative_method="draft", num_speculative_tokens=2, draft_quantization="int8")
    assert isinstance(engine.drafter, DraftModelDrafter) and engine.drafter.model is not loaded.model
    # the target's own weights are untouched by quantizing the draft
    prompt = random_prompts([9], VOCAB, seed=1)[0]
    plain = make_engine(loaded).generate([prompt], greedy(8))[0].token_ids
    assert engine.generate([prompt], greedy(8))[0].token_ids == plain


# -- 1. greedy speculative == greedy, tiny random models ---------------------------------------------

TINY_OUT = 24


@pytest.fixture(scope="module")
def tiny_ref(tiny_llama):
    hf, loaded = tiny_llama
    prompts = random_prompts([3, 60, 17, 1, 44, 9], VOCAB, seed=11)
    motif = random_prompts([7], VOCAB, seed=12)[0]
    prompts.append(motif * 4)  # repetitive: prompt lookup finds matches
    engine = make_engine(loaded)
    alone = [engine.generate([p], greedy(TINY_OUT))[0].token_ids for p in prompts]
    return hf, loaded, prompts, alone


@pytest.mark.parametrize("method", ["quantized", "ngram", "self"])
@pytest.mark.parametrize("k", KS)
def test_tiny_greedy_speculative_equals_plain(tiny_ref, method, k):
    hf, loaded, prompts, alone = tiny_ref
    next_logits = hf_next_logits(hf)
    engine = spec_engine(loaded, method, k)
    solo = [engine.generate([p], greedy(TINY_OUT))[0] for p in prompts]  # one request at a time
    for i, (p, ref, out) in enumerate(zip(prompts, alone, solo)):
        assert_same_or_near_tie(ref, out.token_ids, p, next_logits, what=f"{method} k={k} alone, request {i}")
    accepted_alone, proposed_alone = accepted_and_proposed(engine)
    engine = spec_engine(loaded, method, k)
    batch = engine.generate(prompts, greedy(TINY_OUT))
    assert max(len(r.chunks) for r in engine.step_records) == len(prompts), "the requests never ran together"
    for i, (p, ref, out) in enumerate(zip(prompts, alone, batch)):
        assert_same_or_near_tie(ref, out.token_ids, p, next_logits, what=f"{method} k={k} batch, request {i}")
    accepted, proposed = accepted_and_proposed(engine)
    assert accepted > 0 and accepted_alone > 0, "no draft was ever accepted: speculation did not run"
    assert all(r[2] <= k for r in engine.spec_records)
    if method != "self":
        assert accepted < proposed or accepted_alone < proposed_alone, "no rejection: rollback never ran"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


# -- 1. greedy speculative == greedy, the embedded default model -------------------------------------

REAL_OUT = 24
REAL_TEXTS = [
    "Give me three tips for writing clear Python code.",
    "List the planets of the solar system in order from the sun.",
    "What is the difference between a list and a tuple in Python?",
]


def lazy_hf_next_logits(request):
    """Reference next-token logits from transformers, loaded only if outputs ever diverge."""
    return lambda ids: hf_logits(request.getfixturevalue("hf_default"), ids)[-1]


def real_engine_for(loaded, **overrides) -> LLMEngine:
    fields = dict(device="cpu", max_model_len=512, num_kv_blocks=64)
    fields.update(overrides)
    return LLMEngine(EngineConfig(**fields), loaded=loaded)


@pytest.fixture(scope="module")
def real_ref(default_model):
    prompts = [chat_ids(default_model.tokenizer, t) for t in REAL_TEXTS]
    engine = real_engine_for(default_model)
    return prompts, [engine.generate([p], greedy(REAL_OUT))[0].token_ids for p in prompts]


@pytest.fixture(scope="module")
def real_spec_engines(default_model):
    """One engine per method, shared by every k (quantizing the 135M draft takes seconds); k is
    changed between runs as ``spec_experiment.run_k`` does."""
    engines = {}

    def get(method: str) -> LLMEngine:
        if method not in engines:
            engines[method] = real_engine_for(default_model, num_speculative_tokens=1, **METHODS[method])
        return engines[method]

    return get


@pytest.mark.real_model
@pytest.mark.parametrize("method", ["quantized", "ngram"])
@pytest.mark.parametrize("k", KS)
def test_real_greedy_speculative_equals_plain(request, real_ref, real_spec_engines, method, k):
    prompts, alone = real_ref
    engine = real_spec_engines(method)
    engine.config.num_speculative_tokens = k
    first = len(engine.spec_records)
    i = KS.index(k) % len(prompts)  # each prompt alone at some k
    solo = engine.generate([prompts[i]], greedy(REAL_OUT))[0]
    batch = engine.generate(prompts, greedy(REAL_OUT))
    next_logits = lazy_hf_next_logits(request)
    assert_same_or_near_tie(alone[i], solo.token_ids, prompts[i], next_logits, what=f"{method} k={k} alone")
    for j, (p, ref, out) in enumerate(zip(prompts, alone, batch)):
        assert_same_or_near_tie(ref, out.token_ids, p, next_logits, what=f"{method} k={k} batch, request {j}")
    rows = engine.spec_records[first:]
    accepted, proposed = sum(r[3] for r in rows), sum(r[2] for r in rows)
    assert 0 < accepted < proposed, f"accepted {accepted} of {proposed}: acceptance and rollback both expected"
    assert max(r[2] for r in rows) <= k
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


# -- 2. an identical draft accepts everything ---------------------------------------------------------


def expected_emissions(k: int, max_tokens: int, prompt_len: int, max_model_len: int) -> list[int]:
    """Tokens per emission when every draft is accepted: 1 from the prefill, then k + 1 per step,
    fewer only where max_tokens or max_model_len leaves less room (k drafts emit k + 1)."""
    counts, out = [1], 1
    while out < max_tokens and prompt_len + out < max_model_len:
        room = max(0, min(k, max_tokens - out - 1, max_model_len - prompt_len - out - 1))
        counts.append(room + 1)
        out += room + 1
    return counts


@pytest.mark.parametrize("k", [1, 3, 4, 8])
@pytest.mark.parametrize("sampled", [False, True])
def test_identical_draft_accepts_every_token(tiny_llama, k, sampled):
    """Greedy: exact. Sampled (temperature 0.8): the draft's q and the target's p differ only by
    fp32 rounding between the draft's and the verification's forward passes (~1e-6 relative), so
    a draft is rejected with probability ~1e-6: false failure ~1e-4 over the <= 60 drafts of a
    case for random seeds (the seeds here are fixed)."""
    loaded = tiny_llama[1]
    max_tokens = 21
    prompts = random_prompts([5, 23, 40], VOCAB, seed=3)
    params = [
        SamplingParams(temperature=0.8 if sampled else 0, seed=i, max_tokens=max_tokens, ignore_eos=True)
        for i in range(len(prompts))
    ]
    engine = spec_engine(loaded, "self", k)
    outs = engine.generate(prompts, params)
    accepted, proposed = accepted_and_proposed(engine)
    assert proposed > 0 and accepted == proposed
    for p, o in zip(prompts, outs):
        counts = [n for _, n in o.times.emissions]
        assert counts == expected_emissions(k, max_tokens, len(p), engine.max_model_len)
        assert counts[1] == k + 1 and len(o.token_ids) == max_tokens


@pytest.mark.parametrize("k", [3, 4])
def test_identical_draft_stops_at_max_model_len(tiny_llama, k):
    loaded = tiny_llama[1]
    prompt = random_prompts([17], VOCAB, seed=4)[0]
    engine = spec_engine(loaded, "self", k, max_model_len=40)
    out = engine.generate([prompt], greedy(100))[0]
    assert len(out.token_ids) == 40 - 17 and out.finish_reason == "length"
    assert [n for _, n in out.times.emissions] == expected_emissions(k, 100, 17, 40)
    assert accepted_and_proposed(engine)[0] == accepted_and_proposed(engine)[1]


# -- 4. acceptance and serving figures -----------------------------------------------------------------


def test_acceptance_metrics_on_a_hand_worked_step_history():
    # (step index, request id, proposed, accepted), as engine.spec_records; k = 4, cut near the end
    rows = [(3, "a", 4, 4), (3, "b", 4, 1), (4, "a", 4, 0), (4, "b", 2, 2), (5, "a", 1, 1)]
    m = acceptance_metrics([r[3] for r in rows], [r[2] for r in rows])
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (5, 15, 8)
    assert m.acceptance_rate == approx(8 / 15)
    emitted = sum(r[3] + 1 for r in rows)  # 5 + 2 + 1 + 3 + 2 tokens, bonus included
    assert m.mean_acceptance_length == approx(2.6) == emitted / len(rows)
    # position i: drafts accepting it / drafts proposing it
    assert m.acceptance_rate_per_position == approx([4 / 5, 2 / 4, 1 / 3, 1 / 3])
    a = acceptance_metrics([r[3] for r in rows if r[1] == "a"], [r[2] for r in rows if r[1] == "a"])
    assert a.acceptance_rate == approx(5 / 9) and a.mean_acceptance_length == approx(1 + 5 / 3)
    # a fixed k and all accepted: k + 1 tokens per step
    full = acceptance_metrics([3, 3, 3], 3)
    assert full.acceptance_rate == 1.0 and full.mean_acceptance_length == 4.0


def test_expected_tokens_per_step():
    assert expected_tokens_per_step(1.0, 4) == 5
    assert expected_tokens_per_step(0.0, 4) == approx(1.0)
    assert expected_tokens_per_step(0.5, 2) == approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens_per_step(0.8, 3) == approx(1 + 0.8 + 0.64 + 0.512)


def test_multi_token_emissions_feed_the_serving_figures(tiny_llama):
    """Identical draft, k = 3, 21 tokens: emissions 1, 4, 4, 4, 4, 4. One emission of 4 tokens is one
    ITL gap, so TPOT = (E2EL - TTFT) / 20 = mean ITL / 4."""
    loaded = tiny_llama[1]
    prompts = random_prompts([6, 19], VOCAB, seed=5)
    engine = spec_engine(loaded, "self", 3)
    outs = engine.generate(prompts, greedy(21))
    for o in outs:
        assert [n for _, n in o.times.emissions] == [1, 4, 4, 4, 4, 4]
        m = request_metrics(o)
        assert m.output_tokens == sum(n for _, n in o.times.emissions) == len(o.token_ids) == 21
        assert len(m.itl_s) == 5
        mean_itl = sum(m.itl_s) / len(m.itl_s)
        assert m.tpot_s < mean_itl and m.tpot_s == approx(mean_itl / 4)
        assert m.tpot_s == approx((m.e2el_s - m.ttft_s) / 20)
    acc = acceptance_metrics([r[3] for r in engine.spec_records], [r[2] for r in engine.spec_records])
    assert acc.acceptance_rate == 1.0 and acc.mean_acceptance_length == 4.0
    assert acc.mean_acceptance_length == approx((21 - 1) / len(request_metrics(outs[0]).itl_s))
    s = serving_metrics(outs)
    assert s.total_output_tokens == 42 and s.itl_ms["count"] == 10
    assert s.tpot_ms["mean"] < s.itl_ms["mean"]


@pytest.mark.parametrize("method", ["quantized", "ngram"])
def test_spec_records_match_the_emissions(tiny_ref, method):
    """Every verification row (step, request, proposed, accepted) is one emission of accepted + 1
    tokens of that request, in the step the row names; plain decodes emit 1 token."""
    hf, loaded, prompts, _ = tiny_ref
    engine = spec_engine(loaded, method, 4)
    outs = engine.generate(prompts, greedy(TINY_OUT))
    by_end = {rec.start_s + rec.duration_s: i for i, rec in enumerate(engine.step_records)}
    for o in outs:
        rows = {r[0]: r for r in engine.spec_records if r[1] == o.request_id}
        assert sum(n for _, n in o.times.emissions) == len(o.token_ids) == TINY_OUT
        steps = []
        for t, n in o.times.emissions:
            step = min(by_end, key=lambda end: abs(end - t))  # the step that emitted it
            steps.append(by_end[step])
            row = rows.get(by_end[step])
            assert n == (row[3] + 1 if row else 1), f"emission of {n} tokens in step {by_end[step]}, row {row}"
        assert set(rows) <= set(steps), "a verification row without an emission"
        m = request_metrics(o)
        if any(n > 1 for _, n in o.times.emissions):
            assert m.tpot_s < sum(m.itl_s) / len(m.itl_s)
    assert any(r[3] > 0 for r in engine.spec_records)
    # draft time is part of each step's duration, and only a drafter spends it
    assert all(0 <= rec.draft_s <= rec.duration_s for rec in engine.step_records)
    if method == "quantized":
        assert sum(rec.draft_s for rec in engine.step_records) > 0
    plain = make_engine(loaded)
    plain.generate(prompts[:2], greedy(4))
    assert all(rec.draft_s == 0.0 for rec in plain.step_records)


def test_acceptance_counts_only_the_drafts_a_request_emits(tiny_llama):
    """Issue 29: a greedy request whose draft proposes tokens past its EOS. The identical draft
    (k = 4) accepts every draft: emissions of 1, then 5 tokens a step. With EOS set to output token
    8 (the third of step 2, which covers tokens 6-10), that step emits 3 tokens and drops the
    2 drafts accepted after EOS: they reached no user, so they count neither as proposed nor as
    accepted (``Speculator.release``). Counting them, as before the issue, credits
    the draft with 4 accepted tokens in a step that emitted 3."""
    loaded = tiny_llama[1]
    prompt = random_prompts([13], VOCAB, seed=6)[0]
    ref = make_engine(loaded).generate([prompt], greedy(24))[0].token_ids
    eos = ref[8]
    assert eos not in ref[:8], "the reference emits its EOS earlier: pick another position"
    with_eos = LoadedModel(loaded.model, loaded.tokenizer, loaded.hf_config, {eos}, None)
    engine = spec_engine(with_eos, "self", 4)
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=24))[0]
    assert out.token_ids == ref[:9] and out.finish_reason == "stop"
    emitted = [n for _, n in out.times.emissions]
    assert emitted == [1, 5, 3]
    rows = engine.spec_records
    assert [(r[2], r[3]) for r in rows] == [(4, 4), (3, 3)]  # the last: drafts 1-3 emitted, 4 dropped
    accepted, proposed = accepted_and_proposed(engine)
    assert accepted == sum(emitted[1:]) - 1  # every emitted token but the prefill's and step 1's bonus
    acc = acceptance_metrics([r[3] for r in rows], [r[2] for r in rows])
    assert acc.acceptance_rate == 1.0 and acc.num_draft_tokens == 7


# -- 5. KV rollback keeps the block invariants --------------------------------------------------------


def check_step_invariants(engine: LLMEngine) -> None:
    seqs = [r.seq for r in engine.requests.values()]
    bm = engine.block_manager
    bm.check_invariants(seqs)
    running = {s.request_id for s in engine.scheduler.running}
    for s in seqs:
        if s.request_id in running:
            # no block beyond the computed tokens: rejected drafts' blocks were given back
            assert len(s.block_table) == cdiv(s.num_computed_tokens, bm.block_size), s
            assert s.num_computed_tokens <= s.num_tokens
        else:
            assert not s.block_table and not s.spec_token_ids, s
        if s.spec_token_ids:  # proposed but not verified (a step that paused decodes): harmless
            assert s.num_uncomputed_tokens == 1 and s.request_id in running
    drafter = engine.drafter
    if isinstance(drafter, DraftModelDrafter):
        dseqs = list(drafter.seqs.values())
        drafter.block_manager.check_invariants(dseqs)
        assert set(drafter.seqs) <= running, "the draft cache holds a request that is not running"
        for d in dseqs:
            assert len(d.block_table) == cdiv(d.num_computed_tokens, drafter.block_manager.block_size)


def run_checked(
    engine: LLMEngine, arrivals: list[tuple[int, list[int], SamplingParams]], abort: tuple[int, int] | None = None
) -> list:
    """Step until done, adding each prompt at its step and checking invariants after every step;
    ``abort = (step, index)`` aborts that request at that step. Outputs in arrival order."""
    ids: list[str | None] = [None] * len(arrivals)
    step = 0
    while step < 10_000:
        for i, (at, prompt, params) in enumerate(arrivals):
            if at == step:
                ids[i] = engine.add_request(prompt, params)
        if abort is not None and abort[0] == step:
            engine.abort_request(ids[abort[1]])
        if not engine.has_unfinished_requests() and all(i is not None for i in ids):
            break
        engine.step()
        check_step_invariants(engine)
        step += 1
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "target blocks leaked"
    drafter = engine.drafter
    if isinstance(drafter, DraftModelDrafter):
        assert not drafter.seqs, f"draft caches left behind for requests {sorted(drafter.seqs)}"
        assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks, "draft blocks leaked"
    return [engine.output(i) for i in ids]


def scenario(name: str):
    """(engine overrides, arrivals) of a named stress scenario; greedy and seeded sampled requests."""
    sampled = lambda seed, n: SamplingParams(  # noqa: E731
        temperature=0.9,
        top_p=0.95,
        seed=seed,
        max_tokens=n,
        ignore_eos=True,
    )
    if name == "preemption":  # 12 blocks of 4 tokens: one sequence of 48 fits, five do not
        lengths = [3, 17, 9, 25, 5]
        prompts = random_prompts(lengths, VOCAB, seed=21)
        params = [greedy(20), sampled(1, 20), greedy(20), greedy(20), sampled(2, 20)]
        return dict(num_kv_blocks=12, max_model_len=48), [(0, p, sp) for p, sp in zip(prompts, params)]
    if name == "chunked":  # a 16-token budget: prompts in chunks, drafts dropped when 4 x (k + 1) > 16
        prompts = random_prompts([3, 60, 17, 44, 9], VOCAB, seed=22)
        params = [greedy(24), greedy(24), sampled(3, 24), greedy(24), sampled(4, 24)]
        return (
            dict(max_num_batched_tokens=16, max_num_seqs=4),
            [(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))],
        )
    if name == "prefix":  # a second wave sharing a 24-token prefix with the first hits the cache
        prefix = random_prompts([24], VOCAB, seed=23)[0]
        tails = random_prompts([5, 9, 2, 13, 7, 3], VOCAB, seed=24)
        params = [greedy(16), sampled(5, 16), greedy(16), greedy(16), sampled(6, 16), greedy(16)]
        return (
            dict(enable_prefix_caching=True),
            [(0 if i < 3 else 12, prefix + t, sp) for i, (t, sp) in enumerate(zip(tails, params))],
        )
    raise ValueError(name)


@pytest.mark.parametrize("method", ["quantized", "ngram", "self"])
@pytest.mark.parametrize("name", ["preemption", "chunked", "prefix"])
def test_rollback_keeps_block_invariants(tiny_llama, name, method):
    hf, loaded = tiny_llama
    overrides, arrivals = scenario(name)
    engine = spec_engine(loaded, method, 4, **overrides)
    outs = run_checked(engine, arrivals)
    # the scenario did what it is named for
    recs = engine.step_records
    if name == "preemption":
        assert sum(r.num_preempted for r in recs) > 0, "the tiny pool never preempted"
    if name == "chunked":
        assert any(not logits for r in recs for _, _, logits in r.chunks), "no prompt was split"
    if name == "prefix":
        assert sum(o.num_cached_tokens for o in outs[3:]) > 0, "the second wave never hit the cache"
    accepted, proposed = accepted_and_proposed(engine)
    assert accepted > 0, "no draft accepted"
    # greedy requests still give the plain greedy output, sampled ones are reproducible
    plain = make_engine(loaded, **overrides)
    for (_, prompt, params), out in zip(arrivals, outs):
        assert out.finished and len(out.token_ids) == params.max_tokens
        if params.greedy:
            ref = plain.generate([prompt], params)[0].token_ids
            assert_same_or_near_tie(ref, out.token_ids, prompt, hf_next_logits(hf), what=f"{name} {method}")
    again = run_checked(spec_engine(loaded, method, 4, **overrides), arrivals)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs], "same seeds, different tokens"


@pytest.mark.parametrize("method", ["quantized", "self", "ngram"])
def test_abort_frees_the_draft_cache(tiny_llama, method):
    """An aborted request's draft KV must be released like a finished one's (else the draft pool
    leaks until no sequence can draft any more)."""
    loaded = tiny_llama[1]
    prompts = random_prompts([30, 20, 11], VOCAB, seed=9)
    engine = spec_engine(loaded, method, 4)
    run_checked(engine, [(0, p, greedy(24)) for p in prompts], abort=(4, 0))
    assert engine.output("0").finish_reason == "abort"


@pytest.mark.parametrize("case", ["prefill-first", "budget-1", "budget-8"])
def test_unverified_drafts_leave_the_drafter_working(tiny_llama, case):
    """Drafts can go unverified: prefill-first pauses running decodes when a prompt arrives, and a
    step budget too small for k + 1 tokens per decode drops them. The draft cache then already
    holds every token of the sequence (or all but the newest, which equals its first draft), yet
    the drafter must still run the newest token to get logits. With the target's own weights as
    draft, every draft that is verified must be accepted, the output must be the plain one, and
    nothing may crash."""
    hf, loaded = tiny_llama
    params = greedy(16)
    if case == "prefill-first":
        overrides, k = dict(enable_chunked_prefill=False), 2
        prompts = random_prompts([5, 9, 7], VOCAB, seed=1)
        arrivals = [(0, prompts[0], params), (3, prompts[1], params), (5, prompts[2], params)]
    else:
        budget, seqs, k, n = (1, 1, 2, 1) if case == "budget-1" else (8, 4, 3, 6)
        overrides = dict(max_num_batched_tokens=budget, max_num_seqs=seqs)
        arrivals = [(0, p, params) for p in random_prompts([5] * n, VOCAB, seed=1)]
    engine = spec_engine(loaded, "self", k, **overrides)
    outs = run_checked(engine, arrivals)
    accepted, proposed = accepted_and_proposed(engine)
    assert accepted == proposed, f"the identical draft had {proposed - accepted} of {proposed} drafts rejected"
    plain = make_engine(loaded)
    for (_, prompt, _), out in zip(arrivals, outs):
        assert_same_or_near_tie(
            plain.generate([prompt], params)[0].token_ids, out.token_ids, prompt, hf_next_logits(hf), what=case
        )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(sorted(METHODS)),
    k=st.integers(1, 8),
    block_size=st.sampled_from([1, 2, 4, 16]),
    max_num_seqs=st.integers(1, 6),
    extra_budget=st.integers(0, 40),
    chunked=st.booleans(),
    prefix_caching=st.booleans(),
    spare_blocks=st.integers(0, 30),
    requests=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 20), st.booleans()), min_size=1, max_size=6),
)
# found by this test: a budget of 1 drops the drafts, the plain token equals the first draft, and the
# drafter then runs an empty batch (see test_unverified_drafts_leave_the_drafter_working)
@example(
    method="self",
    k=2,
    block_size=1,
    max_num_seqs=1,
    extra_budget=0,
    chunked=False,
    prefix_caching=False,
    spare_blocks=0,
    requests=[(1, 4, False)],
)
def test_any_schedule_with_speculation(
    tiny_ref, method, k, block_size, max_num_seqs, extra_budget, chunked, prefix_caching, spare_blocks, requests
):
    """Random pools, budgets and policies: invariants after every step, nothing leaked at the end,
    greedy requests equal to plain greedy decoding (near-ties aside)."""
    hf, loaded, _, _ = tiny_ref
    max_model_len = 80
    overrides = dict(
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_seqs + extra_budget,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=prefix_caching,
        max_model_len=max_model_len,
        num_kv_blocks=cdiv(max_model_len, block_size) + spare_blocks,
    )
    prompts = random_prompts([n for n, _, _ in requests], VOCAB, seed=len(requests) * 7 + k)
    arrivals = [
        (i, p, greedy(out) if not samp else SamplingParams(temperature=1.0, seed=i, max_tokens=out))
        for i, (p, (_, out, samp)) in enumerate(zip(prompts, requests))
    ]
    engine = spec_engine(loaded, method, k, **overrides)
    outs = run_checked(engine, arrivals)
    plain = make_engine(loaded, max_model_len=max_model_len)
    for (_, prompt, params), out in zip(arrivals, outs):
        assert out.finished
        if params.greedy:
            ref = plain.generate([prompt], params)[0].token_ids
            assert_same_or_near_tie(ref, out.token_ids, prompt, hf_next_logits(hf), what="random schedule")


# -- sampled speculative decoding in the engine follows the target's law ---------------------------


def joint_reference(hf, prompt: list[int], params: SamplingParams) -> dict[tuple[int, int], float]:
    """P(t1, t2) = p(t1 | prompt) p(t2 | prompt, t1) from transformers' logits (top-k keeps it small)."""
    p1 = probabilities(hf_logits(hf, prompt)[-1], params)
    joint = {}
    for t1 in torch.nonzero(p1).flatten().tolist():
        p2 = probabilities(hf_logits(hf, prompt + [t1])[-1], params)
        for t2 in torch.nonzero(p2).flatten().tolist():
            joint[(t1, t2)] = float(p1[t1] * p2[t2])
    return joint


def lookup_friendly_prompt(hf, params: SamplingParams) -> list[int]:
    """A prompt after which prompt lookup proposes a token the target may sample: it starts with
    [b, w], b a likely first token and w a possible second token after b, and b's latest earlier
    occurrence is that one (so the lookup after b proposes w)."""
    lookup = PromptLookupDrafter(3)
    for seed in range(100, 300):
        rest = random_prompts([40], VOCAB, seed=seed)[0]
        b = int(probabilities(hf_logits(hf, rest)[-1], params).argmax())
        w = int(probabilities(hf_logits(hf, rest + [b])[-1], params).argmax())
        prompt = [b, w] + rest
        p1 = probabilities(hf_logits(hf, prompt)[-1], params)
        if p1[b] < 0.2 or lookup.lookup(prompt + [b], 1) != [w]:
            continue
        if probabilities(hf_logits(hf, prompt + [b])[-1], params)[w] > 0.2:
            return prompt
    raise AssertionError("no prompt found where prompt lookup proposes a plausible token")


@pytest.mark.parametrize("method", ["quantized", "ngram"])
def test_engine_sampled_speculation_follows_the_target_joint_distribution(tiny_llama, method):
    """3,000 seeded requests of one prompt, top_k=3, 3 tokens each: token 1 from the prefill, token 2
    from a verification of one draft (max_tokens leaves room for one). The joint law of
    (t1, t2) must be the target's. Chi-square (at most 8 df): false failure 1e-4 for random seeds."""
    hf, loaded = tiny_llama
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True)
    prompt = lookup_friendly_prompt(hf, params) if method == "ngram" else random_prompts([20], VOCAB, seed=31)[0]
    engine = spec_engine(loaded, method, 2)
    n = 3_000
    outs = engine.generate(
        [prompt] * n,
        [SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True, seed=1000 + i) for i in range(n)],
    )
    rows = engine.spec_records
    assert len(rows) >= n // 10 and all(r[2] == 1 for r in rows)
    assert 0 < sum(r[3] for r in rows) < len(rows), "both acceptances and rejections expected"
    counts = count(tuple(o.token_ids[:2]) for o in outs)
    pval, stat, df = chi_square_p(counts, joint_reference(hf, prompt, params))
    assert pval > ALPHA, f"(t1, t2) do not follow the target: chi2={stat:.1f}, df={df}, counts {counts}"


# -- what a seed promises under speculation -------------------------------------------------------

# top_k=3: the tiny random model then repeats itself enough for prompt lookup to be accepted at times
SEEDED = [SamplingParams(temperature=1.0, top_k=3, seed=seed, max_tokens=32, ignore_eos=True) for seed in (1, 2, 3)]


@pytest.mark.parametrize("method,tight_blocks", [("ngram", 3), ("quantized", 6)])
def test_seeded_speculative_output_does_not_depend_on_the_pool(tiny_llama, method, tight_blocks):
    """Issue 8: three prompts seeded 1, 2 and 3, k = 3, blocks of 16 and max_model_len 48, in a
    tight pool (preemption; the int8 draft's own pool of the same size runs full, so fewer drafts
    are proposed) and in a roomy one. Every request must give, token for token, what plain
    (non-speculative) seeded sampling gives, tight pool or roomy: draws are keyed by seed and
    output position, and verification emits the target's keyed draws (``verify_coupled``).
    The seeds are fixed, so the test is deterministic; a correct engine could only fail it at a
    draw within float rounding of a tie (odds ~1e-6 per token)."""
    loaded = tiny_llama[1]
    motif = random_prompts([5], VOCAB, seed=41)[0]
    prompts = [motif * 3, motif * 2 + [7, 8], random_prompts([9], VOCAB, seed=42)[0]]
    fields = dict(block_size=16, max_model_len=48)
    plain = make_engine(loaded, **fields, num_kv_blocks=64).generate(prompts, SEEDED)
    runs = {}
    for pool in (tight_blocks, 64):
        engine = spec_engine(loaded, method, 3, **fields, num_kv_blocks=pool)
        runs[pool] = (
            engine.generate(prompts, SEEDED),
            accepted_and_proposed(engine),
            sum(r.num_preempted for r in engine.step_records),
        )
    (tight, (acc_t, prop_t), preempted_t), (roomy, (acc_r, prop_r), _) = runs[tight_blocks], runs[64]
    assert acc_t > 0 and acc_r > 0, "no draft was accepted: the test proves nothing"
    assert preempted_t > 0 or prop_t < prop_r, "the tight pool changed nothing in the schedule"
    for i, (p, t, r) in enumerate(zip(plain, tight, roomy)):
        assert len(p.token_ids) == 32
        assert t.token_ids == r.token_ids == p.token_ids, f"request seeded {i + 1}: the pool changed its tokens"


@pytest.mark.parametrize("method", ["ngram", "quantized"])
def test_seeded_speculative_output_with_preemption_and_batch_mates(tiny_llama, method):
    """The same promise against batch-mates, chunked prefill and preemption: a seeded request
    among others in a pool of 12 blocks of 4, against it alone without speculation."""
    loaded = tiny_llama[1]
    motif = random_prompts([4], VOCAB, seed=43)[0]
    other, short = random_prompts([17, 5], VOCAB, seed=44)
    prompts = [motif * 4, other, motif * 2 + [9], short]
    params = [SamplingParams(temperature=1.0, top_k=3, seed=10 + i, max_tokens=20, ignore_eos=True) for i in range(4)]
    alone = [make_engine(loaded).generate([p], sp)[0].token_ids for p, sp in zip(prompts, params)]
    engine = spec_engine(
        loaded, method, 4, num_kv_blocks=12, max_model_len=48, max_num_batched_tokens=12, max_num_seqs=4
    )
    outs = engine.generate(prompts, params)
    assert any(o.times.num_preemptions for o in outs), "the tiny pool never preempted"
    assert accepted_and_proposed(engine)[0] > 0
    assert [o.token_ids for o in outs] == alone


# -- stops inside an accepted run of drafts -----------------------------------------------------------


def with_letters(loaded: LoadedModel) -> LoadedModel:
    """The tiny model with a tokenizer whose ids decode to letters, so stop strings apply."""
    return LoadedModel(loaded.model, FakeTokenizer(), loaded.hf_config, set(), None)


@pytest.mark.parametrize("method", ["self", "quantized"])
def test_stop_token_inside_accepted_drafts_ends_the_output_there(tiny_llama, method, monkeypatch):
    loaded = tiny_llama[1]
    prompt = random_prompts([13], VOCAB, seed=6)[0]
    ref = make_engine(loaded).generate([prompt], greedy(24))[0].token_ids
    seen = []  # per emission: (the tokens the step produced, how many the request kept)

    def recording(req, token_ids, *args):
        kept, delta, status = append_tokens(req, token_ids, *args)
        seen.append((len(token_ids), len(kept)))
        return kept, delta, status

    monkeypatch.setattr(engine_core, "append_tokens", recording)
    dropped = 0  # accepted tokens dropped after a stop, over all cases
    for j in (4, 7, 10, 13):
        stop = ref[j]
        cut = ref[: ref.index(stop) + 1]
        params = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop], ignore_eos=True)
        engine = spec_engine(loaded, method, 4)
        seen.clear()
        out = engine.generate([prompt], params)[0]
        assert out.token_ids == cut and out.finish_reason == "stop"
        assert sum(n for _, n in out.times.emissions) == len(cut)
        dropped += sum(produced - kept for produced, kept in seen)
        # the acceptance figures count only the drafts emitted (issue 29): the last step's row, if
        # it verified drafts, counts no position past the tokens that step emitted
        last = [r for r in engine.spec_records if r[0] == len(engine.step_records) - 1]
        assert all(max(r[2], r[3]) <= out.times.emissions[-1][1] for r in last)
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert dropped > 0, "no stop token fell inside a run of accepted drafts"


@pytest.mark.parametrize("method", ["self", "quantized"])
def test_stop_string_inside_accepted_drafts_gives_the_plain_output(tiny_llama, method):
    """A stop string completed by an accepted draft ends the output at that token, as in plain
    decoding: the tokens accepted after it must be dropped, not only their text."""
    loaded = with_letters(tiny_llama[1])
    prompt = random_prompts([13], VOCAB, seed=6)[0]
    text = FakeTokenizer().decode(make_engine(loaded).generate([prompt], greedy(24))[0].token_ids)
    for j in (3, 6, 9, 12):
        params = SamplingParams(temperature=0, max_tokens=24, stop=[text[j : j + 2]], ignore_eos=True)
        plain = make_engine(loaded).generate([prompt], params)[0]
        spec = spec_engine(loaded, method, 4).generate([prompt], params)[0]
        assert plain.finish_reason == "stop"
        assert (spec.text, spec.finish_reason) == (plain.text, plain.finish_reason)
        assert spec.token_ids == plain.token_ids, (
            f"stop {text[j : j + 2]!r}: speculative output kept {len(spec.token_ids) - len(plain.token_ids)} "
            f"tokens past the stop string"
        )


def test_spec_experiment_functions_report_consistent_figures(tiny_engine):
    """k_sweep, speculative_batch_sweep and machinery_overhead on a tiny engine with an identical draft: every
    draft is accepted, so the measured tokens per step match the formula at a = 1 (k + 1, cut
    only at the end of the output), and the timing figures are positive."""
    from helpers import random_prompts

    from minieng.lab.speculative import k_sweep, machinery_overhead, speculative_batch_sweep

    engine = tiny_engine(speculative_method="draft", num_speculative_tokens=1)
    prompts = random_prompts([12], 300, seed=3)
    res = k_sweep(engine, prompts, ks=(1, 3), output_tokens=13)
    assert res["baseline"]["k"] == 0 and res["baseline"]["tokens_per_step"] == 1
    for row in res["rows"]:
        assert row["acceptance_rate"] == 1.0
        assert row["expected_tokens_per_step"] == row["k"] + 1
        assert 1 < row["tokens_per_step"] <= row["k"] + 1
        assert row["c"] > 0 and row["v"] > 0 and row["predicted_speedup_x"] > 0 and row["measured_speedup_x"] > 0
    assert engine.config.num_speculative_tokens == 1, "the sweep restores k"
    rows = speculative_batch_sweep(engine, [prompts, random_prompts([12, 9], 300, seed=4)], k=2, output_tokens=7)
    assert [r["batch_size"] for r in rows] == [1, 2] and all(r["acceptance_rate"] == 1.0 for r in rows)
    m = machinery_overhead(engine, prompts[0], 2, output_tokens=9)
    assert m["verify_forward_ms"] > 0 and m["plain_chunk_forward_ms"] > 0 and 0 <= m["bookkeeping_percent"] < 100
    assert engine.config.max_num_batched_tokens >= engine.config.max_num_seqs, "the budget is restored"


def verify_sampled(
    draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor, generator: torch.Generator | None
) -> list[int]:
    """Rejection-sampling verification of one sequence.

    Not what the engine runs (``verification.py`` says why): the textbook rule, the reference the
    coupled rule is held to.

    Args:
        draft_tokens: the k proposed tokens.
        draft_probs: [k, vocab], q_i: the distribution each draft token was drawn from.
        target_probs: [k + 1, vocab], p_i after the same temperature / top-k / top-p.
        generator: where the uniforms and resamples come from (for reproducible draws, a keyed
            one: ``sampling.KeyedRandom.generator(position, purpose)``).
    Returns:
        the emitted tokens (1 to k + 1).
    """
    device = target_probs.device
    out = []
    for i, token in enumerate(draft_tokens):
        p, q = target_probs[i, token], draft_probs[i, token]
        u = torch.rand((), generator=generator, device=device)
        if q > 0 and u * q <= p:  # u <= p / q, without dividing by a tiny q
            out.append(token)
            continue
        residual = torch.clamp(target_probs[i] - draft_probs[i], min=0)
        total = residual.sum()
        # p == q exactly leaves no residual mass; then every token was accepted with prob 1 and we
        # cannot be here, except through float rounding: fall back to p itself.
        dist = residual / total if total > 0 else target_probs[i]
        out.append(int(torch.multinomial(dist, 1, generator=generator).item()))
        return out
    out.append(int(torch.multinomial(target_probs[len(draft_tokens)], 1, generator=generator).item()))
    return out

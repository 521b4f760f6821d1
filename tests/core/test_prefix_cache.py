"""The prefix cache (DESIGN.md section 8) never changes an output, and hits exactly where it should.

Greedy fp32 throughout. Outputs with the cache on are compared with a cache-off reference over the
same weights; a prefix hit changes the shapes of the matrix products (only the suffix is
computed), so the only divergence accepted is an exact near-tie (``assert_same_or_near_tie``).

Hits are predicted independently of the block manager: a request admitted at a step can hit the
full blocks of every token computed *before* that step (by any request, finished or running,
evictions aside), floored to whole blocks and capped so its last prompt token is computed. The
``Driver`` below steps the engine by hand, checks the block manager's invariants after every step
and compares each request's ``num_cached_tokens`` with that prediction at its first admission.
"""

from __future__ import annotations

import pytest
from helpers import assert_same_or_near_tie, hf_next_logits, make_engine, random_prompts
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from minieng import EngineConfig, LLMEngine, SamplingParams
from minieng.core import block_manager as bm_module
from minieng.core.block_manager import BlockManager, block_hash
from minieng.core.sequence import Sequence
from minieng.measure.metrics import serving_metrics

TINY_OUT = 8
REAL_OUT = 5


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def expected_hit(prompt, history, block_size: int) -> int:
    """Cached tokens a prompt should get when ``history`` (token lists whose KV was computed) is
    all still cached: the longest shared prefix floored to full blocks, at most
    ``(len - 1) // block_size`` blocks (the last prompt position is always computed)."""
    best = max((lcp(prompt, h) for h in history), default=0)
    return min(best // block_size, (len(prompt) - 1) // block_size) * block_size


def chain_keys(tokens, block_size: int, extra_keys: tuple = ()) -> list[bytes]:
    """The prefix-cache keys of the full blocks of ``tokens``, recomputed from scratch."""
    keys, parent = [], b""
    for i in range(len(tokens) // block_size):
        parent = block_hash(parent, tokens[i * block_size : (i + 1) * block_size], extra_keys)
        keys.append(parent)
    return keys


def constant_hash(parent: bytes, token_ids, extra_keys: tuple = ()) -> bytes:
    """A hash under which every block collides: to test the hit check independently of the hash."""
    return b"same"


class Driver:
    """Steps an engine by hand: adds requests at given steps, checks the block manager after every
    step, and checks each request's hit count at its first admission.

    ``exact_hits``: while no block has been evicted, a request's ``num_cached_tokens`` must equal
    ``expected_hit`` over every token computed before its admission step; after evictions it may
    only be smaller.
    """

    def __init__(self, engine: LLMEngine, exact_hits: bool = True):
        self.engine = engine
        self.exact_hits = exact_hits
        self.computed: dict[str, list[int]] = {}  # request id -> longest computed prefix seen
        self.checked: set[str] = set()
        self.hits: dict[str, tuple[int, int]] = {}  # request id -> (expected, actual)
        # Key -> block tokens of every full block whose KV some request computed.
        self.valid: dict[bytes, tuple[int, ...]] = {}
        self._keys: dict[str, list[bytes]] = {}

    def history(self) -> list[list[int]]:
        return list(self.computed.values())

    def _observe(self) -> None:
        for rid, req in self.engine.requests.items():
            seq = req.seq
            if seq.is_finished:
                tokens = seq.all_token_ids[:-1]  # the last sampled token is never computed
            else:
                tokens = seq.all_token_ids[: seq.num_computed_tokens]
            if len(tokens) > len(self.computed.get(rid, [])):
                self.computed[rid] = tokens
                bs = self.engine.block_manager.block_size
                keys = self._keys.setdefault(rid, [])
                while len(keys) < len(tokens) // bs:
                    i = len(keys)
                    block = tokens[i * bs : (i + 1) * bs]
                    keys.append(block_hash(keys[-1] if keys else b"", block, seq.extra_keys))
                    self.valid[keys[-1]] = tuple(block)

    def check_cache_entries(self) -> None:
        """Every cache entry is a full block whose KV was computed, holding that key's tokens (under
        a constant hash, where keys say nothing: the tokens of some computed block)."""
        bm = self.engine.block_manager
        computed_blocks = set(self.valid.values())
        for key, block in bm.cached.items():
            if bm_module.block_hash is not block_hash:  # the hash is replaced (a constant)
                assert bm.block_tokens[block] in computed_blocks, f"block {block} holds tokens never computed"
                continue
            assert key in self.valid, f"block {block} is in the cache but its tokens were never all computed"
            assert bm.block_tokens[block] == self.valid[key], f"block {block} holds other tokens than its key"

    def step(self):
        engine, bm = self.engine, self.engine.block_manager
        self._observe()
        history = {rid: list(t) for rid, t in self.computed.items()}
        outputs = engine.step()
        running, waiting = engine.scheduler.running, engine.scheduler.waiting
        bm.check_invariants(list(running) + [s for s in waiting if s.block_table])
        for seq in running:  # one physical block holds one position of a sequence
            assert len(set(seq.block_table)) == len(seq.block_table), f"{seq}: a block at two positions"
        for seq in waiting:
            if seq.times.num_preemptions:
                assert not seq.block_table and seq.num_computed_tokens == 0
        if engine.step_records:
            assert engine.step_records[-1].num_evictions == bm.num_evictions
        for req in engine.requests.values():
            seq = req.seq
            if seq.request_id in self.checked or seq.times.first_scheduled_s is None:
                continue
            self.checked.add(seq.request_id)
            others = [t for rid, t in history.items() if rid != seq.request_id]
            want = expected_hit(seq.prompt_token_ids, others, bm.block_size) if bm.enable_prefix_caching else 0
            got = seq.num_cached_tokens
            self.hits[seq.request_id] = (want, got)
            assert got % bm.block_size == 0 and got < seq.num_prompt_tokens
            if self.exact_hits and bm.num_evictions == 0:
                assert got == want, (
                    f"request {seq.request_id} (prompt {seq.num_prompt_tokens} tokens) got "
                    f"{got} cached tokens, expected {want}"
                )
            else:
                assert got <= want, f"request {seq.request_id}: {got} cached tokens, more than ever computed ({want})"
        self._observe()
        self.check_cache_entries()
        return outputs

    def run(self, prompts, params, arrivals=None, max_steps: int = 5000):
        """Add ``prompts[i]`` before step ``arrivals[i]`` (counted from now; default all at once),
        step until every one finishes; outputs in prompt order."""
        engine = self.engine
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        arrivals = list(arrivals or [0] * len(prompts))
        ids = [None] * len(prompts)
        for k in range(max_steps):
            for i, a in enumerate(arrivals):
                if a == k:
                    ids[i] = engine.add_request(prompts[i], params[i])
            if k > max(arrivals, default=-1) and not engine.has_unfinished_requests():
                break
            self.step()
        else:
            raise AssertionError(f"not finished after {max_steps} steps: the engine made no progress")
        return [engine.output(i) for i in ids]

    def run_each(self, prompts, params):
        """Send the prompts one after another, each finished before the next is added."""
        return [self.run([p], params)[0] for p in prompts]


def check_final_state(engine: LLMEngine, driver: Driver | None = None) -> None:
    """Nothing runs: every block is free with ref count 0, and the cache map is consistent."""
    bm = engine.block_manager
    assert not engine.has_unfinished_requests()
    assert bm.num_free_blocks == bm.num_blocks and all(r == 0 for r in bm.ref_counts)
    bm.check_invariants([])
    for key, block in bm.cached.items():
        assert bm.block_keys[block] == key
        assert bm.block_tokens[block] is not None and len(bm.block_tokens[block]) == bm.block_size
    for block, key in enumerate(bm.block_keys):
        if key is not None:
            assert bm.cached.get(key) == block, f"block {block} carries a key the cache map does not point at it for"
    if driver is not None:
        driver.check_cache_entries()


def check_outputs(prompts, references, outputs, next_logits, what: str) -> None:
    assert len(outputs) == len(prompts)
    for i, (prompt, ref, out) in enumerate(zip(prompts, references, outputs)):
        assert out.finished and out.prompt_token_ids == list(prompt)
        assert_same_or_near_tie(ref, out.token_ids, prompt, next_logits, what=f"{what}, request {i}")


def num_split_prompts(engine: LLMEngine) -> int:
    """Prefill chunks that stopped before the end of their sequence (no logits rows)."""
    return sum(1 for rec in engine.step_records for _, _, logits_rows in rec.chunks if not logits_rows)


# -- tiny random Llama: references ----------------------------------------------------------------


class TinyReference:
    """Greedy outputs of a cache-off engine, each prompt run alone, memoized."""

    def __init__(self, loaded):
        self.engine = make_engine(loaded, enable_prefix_caching=False)
        self.memo: dict[tuple, list[int]] = {}

    def __call__(self, prompt, n: int = TINY_OUT) -> list[int]:
        key = tuple(prompt)
        if len(self.memo.get(key, ())) < n:
            out = self.engine.generate([list(prompt)], greedy(max(n, TINY_OUT)))[0]
            assert out.num_cached_tokens == 0
            self.memo[key] = out.token_ids
        return self.memo[key][:n]


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    hf, loaded = tiny_llama
    assert not make_engine(loaded, enable_prefix_caching=False).block_manager.enable_prefix_caching
    return loaded, TinyReference(loaded), hf_next_logits(hf)


VOCAB = 300


def tiny_prefix_length_prompts(seed: int):
    """Prefixes of one random sequence around block boundaries of 16, and prompts sharing a
    prefix of 15, 16, 17 tokens of another, then different suffixes."""
    base, other, *suffixes = random_prompts([40, 48, 9, 9, 9, 20], VOCAB, seed)
    lengths = [15, 16, 17, 31, 32, 33]
    shared = []
    for s, suf in zip((15, 16, 17), suffixes):
        suf = [(t + 1) % VOCAB if i == 0 and t == other[s] else t for i, t in enumerate(suf)]
        shared.append(other[:s] + suf)
    return [base[:n] for n in lengths], other[:40], shared, suffixes[3]


# -- 1. cache on == cache off, hits at block boundaries ----------------------------------------------


@pytest.mark.parametrize("chunked,budget", [(True, 512), (False, 512), (True, 16)])
def test_tiny_cache_on_equals_off_around_block_boundaries(tiny, chunked, budget):
    loaded, ref, next_logits = tiny
    prefix_prompts, seed, shared, distinct = tiny_prefix_length_prompts(seed=3)
    engine = make_engine(
        loaded,
        block_size=16,
        num_kv_blocks=64,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=budget,
        max_num_seqs=min(16, budget),
    )
    driver = Driver(engine)
    params = greedy(TINY_OUT)

    outs = driver.run_each(prefix_prompts, params)
    # 15: nothing cached yet; 16: one full block shared but it holds the last prompt token;
    # 17, 31, 32: one block; 33: two blocks (32 was cached by the 32-token prompt).
    assert [o.num_cached_tokens for o in outs] == [0, 0, 16, 16, 16, 32]

    outs += driver.run_each([seed], params)
    shared_outs = driver.run_each(shared, params)
    # Shared prefixes of 15, 16, 17 tokens: the block-size floor gives 0, 16, 16.
    assert [o.num_cached_tokens for o in shared_outs] == [0, 16, 16]
    distinct_out = driver.run_each([distinct], params)
    assert distinct_out[0].num_cached_tokens == 0
    outs += shared_outs + distinct_out

    prompts = prefix_prompts + [seed] + shared + [distinct]
    assert engine.block_manager.num_evictions == 0
    check_outputs(prompts, [ref(p) for p in prompts], outs, next_logits, f"chunked={chunked} budget={budget}")
    check_final_state(engine, driver)


def test_tiny_cache_on_equals_off_with_staggered_arrivals(tiny):
    """Requests arrive while earlier ones still run: hits on blocks held by running sequences
    (shared, ref count > 1), including blocks filled by decodes."""
    loaded, ref, next_logits = tiny
    prefix_prompts, seed, shared, distinct = tiny_prefix_length_prompts(seed=4)
    prompts = [seed] + prefix_prompts + shared + [distinct]
    engine = make_engine(loaded, block_size=16, num_kv_blocks=64)
    driver = Driver(engine)
    outs = driver.run(prompts, greedy(24), arrivals=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert max(len(r.chunks) for r in engine.step_records) >= 8, "the requests never ran together"
    assert max(engine.block_manager.ref_counts) == 0
    hits = [o.num_cached_tokens for o in outs]
    assert hits[1:] == [0, 0, 16, 16, 16, 32, 0, 16, 16, 0]
    assert engine.block_manager.num_evictions == 0
    check_outputs(prompts, [ref(p, 24) for p in prompts], outs, next_logits, "staggered")
    check_final_state(engine, driver)


def test_tiny_sharing_running_blocks_raises_ref_counts(tiny):
    """While two sequences share a cached prefix, its blocks' ref count is 2 and they are not free."""
    loaded, ref, next_logits = tiny
    p, sa, sb = random_prompts([32, 5, 7], VOCAB, seed=21)
    engine = make_engine(loaded, block_size=16, num_kv_blocks=64)
    driver = Driver(engine)
    a = engine.add_request(p + sa, greedy(20))
    driver.step()
    b = engine.add_request(p + sb, greedy(20))
    driver.step()
    sa_seq, sb_seq = engine.requests[a].seq, engine.requests[b].seq
    assert sb_seq.num_cached_tokens == 32
    assert sa_seq.block_table[:2] == sb_seq.block_table[:2]
    bm = engine.block_manager
    for block in sa_seq.block_table[:2]:
        assert bm.ref_counts[block] == 2 and block not in bm.free_blocks
    assert sa_seq.block_table[2] != sb_seq.block_table[2]
    driver.run([], [])
    outs = [engine.output(a), engine.output(b)]
    check_outputs([p + sa, p + sb], [ref(p + sa, 20), ref(p + sb, 20)], outs, next_logits, "shared running blocks")
    check_final_state(engine, driver)


# -- 1b. a hash that collides on every block ---------------------------------------------------------


@pytest.mark.parametrize("hash_kind", ["sha256", "constant"])
def test_tiny_a_block_repeated_at_another_position_is_not_its_own_parent(tiny, monkeypatch, hash_kind):
    """P = X + X + t, sent twice (issue 8): both 16-token blocks hold X. Under a constant hash the
    second block's key finds the first block, whose tokens match: only its parent (none, where the
    prompt's second block needs the block holding X at 0-15) tells them apart. At most the first
    block may be a hit there; with the real hash both are, in two distinct blocks."""
    loaded, ref, next_logits = tiny
    if hash_kind == "constant":
        monkeypatch.setattr(bm_module, "block_hash", constant_hash)
    x, t = random_prompts([16, 1], VOCAB, seed=12)
    prompt = x + x + t
    engine = make_engine(loaded, block_size=16, num_kv_blocks=64)
    driver = Driver(engine, exact_hits=hash_kind == "sha256")
    first, second = driver.run_each([prompt, prompt], greedy(16))
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == (32 if hash_kind == "sha256" else 16)
    check_outputs([prompt] * 2, [ref(prompt, 16)] * 2, [first, second], next_logits, f"X + X + t, {hash_kind}")
    check_final_state(engine, driver)


def test_block_manager_checks_the_parent_not_only_the_tokens(monkeypatch):
    """The same at the block manager: under a constant hash a block matching a prompt's tokens at
    another position, or after another parent, or with other extra keys, is a miss."""
    monkeypatch.setattr(bm_module, "block_hash", constant_hash)
    x, y = [1, 2, 3, 4], [5, 6, 7, 8]
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    first = seq_of(x + x + [0])
    compute(bm, first)
    assert len(bm.cached) == 1  # every key collides: the first block's entry stays
    assert bm.match_prefix(seq_of(x + x + [9])) == first.block_table[:1]  # not [b0, b0]
    assert bm.match_prefix(seq_of(y + x + [9])) == []
    assert bm.match_prefix(seq_of(x + [9], extra_keys=("lora-1",))) == []
    # Another sequence computing X + X caches nothing more, and still gets one hit, not two.
    again = seq_of(x + x + [5], "again")
    compute(bm, again)
    assert again.block_table[0] == first.block_table[0] and again.block_table[1] != first.block_table[0]
    assert len(bm.cached) == 1
    bm.check_invariants([first, again])


@pytest.mark.parametrize("case", ["boundaries", "staggered", "twice", "conversation", "preemption", "ngram"])
def test_tiny_constant_hash_gives_the_cache_off_outputs(tiny, monkeypatch, case):
    """Workloads of the sections below, rerun with a hash that collides on every block: the hit
    counts change (fewer hits), the outputs must not (cache-off references, near-ties aside)."""
    loaded, ref, next_logits = tiny
    monkeypatch.setattr(bm_module, "block_hash", constant_hash)
    prefix_prompts, seed, shared, distinct = tiny_prefix_length_prompts(seed=3)
    motif = random_prompts([4], VOCAB, seed=13)[0]
    arrivals, n_out, overrides = None, TINY_OUT, dict(block_size=16, num_kv_blocks=64)
    if case == "boundaries":
        prompts = prefix_prompts + [seed] + shared + [distinct]
    elif case == "staggered":
        prompts, arrivals, n_out = [seed] + prefix_prompts + shared + [distinct], list(range(11)), 24
    elif case == "twice":  # repeated blocks at every position, block size 4
        prompts = [motif * 5 + [1], motif * 3 + [2], motif * 5 + [1], motif * 4]
        overrides = dict(block_size=4, num_kv_blocks=64)
    elif case == "conversation":
        p, more = random_prompts([10, 6], VOCAB, seed=31)
        prompts = [p, p + ref(p, 14) + more, motif * 2 + p, p]
        overrides = dict(block_size=4, num_kv_blocks=64)
    elif case == "preemption":
        prompts = [motif * 3 + s for s in random_prompts([4] * 6, VOCAB, seed=71)]
        arrivals, n_out, overrides = [0] * 6, 16, dict(block_size=4, num_kv_blocks=12, max_model_len=48)
    else:  # prompt lookup drafts, rolled back before blocks are cached
        prompts = [motif * 4 + [3], motif * 4 + [3], motif * 2 + [7]]
        arrivals, n_out = [0, 2, 4], 16
        overrides = dict(block_size=4, num_kv_blocks=64, speculative_method="ngram", num_speculative_tokens=3)
    engine = make_engine(loaded, **overrides)
    driver = Driver(engine, exact_hits=False)
    params = greedy(n_out)
    outs = driver.run(prompts, params, arrivals) if arrivals else driver.run_each(prompts, params)
    if case == "preemption":
        assert sum(r.num_preempted for r in engine.step_records) > 0, "the tiny pool never preempted"
    check_outputs(prompts, [ref(p, n_out) for p in prompts], outs, next_logits, f"constant hash, {case}")
    check_final_state(engine, driver)


# -- 2. a prompt sent twice ------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [16, 4, 1])
def test_tiny_prompt_sent_twice(tiny, block_size):
    loaded, ref, next_logits = tiny
    lengths = [1, 2, 15, 16, 17, 31, 32, 33, 48, 49]
    prompts = random_prompts(lengths, VOCAB, seed=7 + block_size)
    for i, p in enumerate(prompts):
        p[0] = 200 + i  # no two share even their first token
    engine = make_engine(loaded, block_size=block_size, num_kv_blocks=1024 // block_size)
    driver = Driver(engine)
    first = driver.run_each(prompts, greedy(TINY_OUT))
    second = driver.run_each(prompts, greedy(TINY_OUT))
    assert [o.num_cached_tokens for o in first] == [0] * len(prompts)
    assert [o.num_cached_tokens for o in second] == [(n - 1) // block_size * block_size for n in lengths]
    if block_size == 16:
        assert second[lengths.index(32)].num_cached_tokens == 16  # not 32: the last position is computed
    for a, b in zip(first, second):
        assert_same_or_near_tie(a.token_ids, b.token_ids, a.prompt_token_ids, next_logits, "first vs second send")
    check_outputs(prompts, [ref(p) for p in prompts], second, next_logits, f"second send, block_size={block_size}")
    check_final_state(engine, driver)


def test_tiny_conversation_hits_blocks_filled_by_decodes(tiny):
    """A follow-up prompt = prompt + its output + more text hits blocks written by decode steps."""
    loaded, ref, next_logits = tiny
    p, more = random_prompts([10, 6], VOCAB, seed=31)
    engine = make_engine(loaded, block_size=4, num_kv_blocks=64)
    driver = Driver(engine)
    first = driver.run([p], greedy(14))[0]
    follow = p + first.token_ids + more  # 10 + 14 + 6 = 30 tokens; 23 were computed
    second = driver.run([follow], greedy(TINY_OUT))[0]
    assert second.num_cached_tokens == 20  # 5 full blocks of the 23 computed tokens
    check_outputs([p, follow], [ref(p, 14), ref(follow)], [first, second], next_logits, "conversation")
    check_final_state(engine, driver)


@pytest.mark.real_model
def test_real_cache_on_equals_off_and_hits(default_model, real_next_logits):
    """SmolLM2, real text: prefix lengths around 16, shared prefixes of 15/16/17 tokens, and a
    prompt sent twice, against a cache-off engine sharing the weights."""
    from minieng.measure.workloads import text_prompts

    tok = default_model.tokenizer
    base, other, s1, s2, s3, distinct, p40 = text_prompts(tok, 48, 7)
    prefix_prompts = [base[:n] for n in (15, 16, 17, 31, 32, 33)]
    shared = [other[:s] + suf[:8] for s, suf in zip((15, 16, 17), (s1, s2, s3))]
    for s, suf in zip((15, 16, 17), (s1, s2, s3)):
        assert suf[0] != other[s], "test data: the suffix must differ right after the shared prefix"
    twice = [base[:32], p40[:40]]
    prompts = prefix_prompts + [other[:40]] + shared + [distinct[:20]] + twice + twice

    fields = dict(device="cpu", max_model_len=256, num_kv_blocks=64)
    reference = LLMEngine(EngineConfig(**fields, enable_prefix_caching=False), loaded=default_model)
    distinct_prompts = list({tuple(p): p for p in prompts}.values())
    ref_outs = {tuple(o.prompt_token_ids): o.token_ids for o in reference.generate(distinct_prompts, greedy(REAL_OUT))}

    engine = LLMEngine(EngineConfig(**fields), loaded=default_model)
    assert engine.config.enable_prefix_caching  # on by default
    driver = Driver(engine)
    outs = driver.run_each(prompts, greedy(REAL_OUT))
    hits = [o.num_cached_tokens for o in outs]
    assert hits[:6] == [0, 0, 16, 16, 16, 32]
    assert hits[7:10] == [0, 16, 16]  # after other[:40] was cached: the block-size floor
    assert hits[10] == 0
    # base[:32] was cached by the prefix prompts (16 of it: the cap); p40 is new, then sent again.
    assert hits[11:] == [16, 0, 16, 32]
    check_outputs(prompts, [ref_outs[tuple(p)] for p in prompts], outs, real_next_logits, "real, cache on vs off")
    check_final_state(engine, driver)


@pytest.fixture
def real_next_logits(request):
    """transformers' next-token logits, loaded only if a near-tie must be examined."""

    def next_logits(ids):
        return hf_next_logits(request.getfixturevalue("hf_default"))(ids)

    return next_logits


# -- 3. requests sharing a prefix admitted in the same step -----------------------------------------


@pytest.mark.parametrize("chunked", [True, False])
def test_tiny_same_step_admissions_cannot_hit_each_other(tiny, chunked):
    loaded, ref, next_logits = tiny
    p, sa, sb, sc = random_prompts([32, 6, 9, 4], VOCAB, seed=41)
    engine = make_engine(loaded, block_size=16, num_kv_blocks=64, enable_chunked_prefill=chunked)
    driver = Driver(engine)
    a = engine.add_request(p + sa, greedy(TINY_OUT))
    b = engine.add_request(p + sb, greedy(TINY_OUT))
    driver.step()
    assert len(engine.step_records[0].chunks) == 2, "both requests should be admitted in the first step"
    assert engine.output(a).num_cached_tokens == 0
    assert engine.output(b).num_cached_tokens == 0, "b hit blocks a had not computed yet"
    # Both computed the same two prefix blocks; only one copy is registered.
    assert len(engine.block_manager.cached) == 2  # a's two prefix blocks; b's duplicates are not entered
    c = engine.add_request(p + sc, greedy(TINY_OUT))
    driver.run([], [])
    assert engine.output(c).num_cached_tokens == 32
    prompts = [p + sa, p + sb, p + sc]
    outs = [engine.output(i) for i in (a, b, c)]
    check_outputs(prompts, [ref(x) for x in prompts], outs, next_logits, f"same step, chunked={chunked}")
    check_final_state(engine, driver)


# -- 4. reuse after eviction -------------------------------------------------------------------------


def test_tiny_prefix_reused_after_eviction_only_while_it_survives(tiny):
    """Cache a prefix, run k other distinct requests in a small pool, resend: the hit equals what
    the cache map still holds of the prefix, and the output equals the cache-off reference."""
    loaded, ref, next_logits = tiny
    bs, num_blocks = 4, 16
    prefix, tail, *others = random_prompts([16, 3] + [12] * 6, VOCAB, seed=51)
    prompt = prefix + tail  # 19 tokens: 4 full prompt blocks
    params = greedy(6)
    seen_hits, seen_evictions = [], []
    for k in range(len(others) + 1):
        engine = make_engine(loaded, block_size=bs, num_kv_blocks=num_blocks, max_model_len=64)
        bm = engine.block_manager
        driver = Driver(engine)
        first = driver.run([prompt], params)[0]
        outs = driver.run_each(others[:k], params)
        # What survives of the prompt's chain of full blocks, read from the cache map.
        surviving = 0
        for i, key in enumerate(chain_keys(prompt, bs)[: (len(prompt) - 1) // bs]):
            block = bm.cached.get(key)
            if block is None or bm.block_tokens[block] != tuple(prompt[i * bs : (i + 1) * bs]):
                break
            surviving += 1
        evictions = bm.num_evictions
        again = driver.run([prompt], params)[0]
        assert again.num_cached_tokens == surviving * bs, (
            f"k={k}: {again.num_cached_tokens} cached, {surviving} blocks survived"
        )
        if surviving == 0:
            assert evictions > 0
        seen_hits.append(again.num_cached_tokens)
        seen_evictions.append(evictions)
        check_outputs(
            [prompt] * 2 + others[:k],
            [ref(prompt, 6)] * 2 + [ref(o, 6) for o in others[:k]],
            [first, again] + outs,
            next_logits,
            f"after {k} other requests",
        )
        check_final_state(engine, driver)
    # LRU with tails freed first: the prefix erodes from its end, and is gone after enough traffic.
    assert seen_hits[0] == 16
    assert seen_hits == sorted(seen_hits, reverse=True)
    assert seen_hits[-1] == 0 and seen_evictions[-1] > 0
    assert any(0 < h < 16 for h in seen_hits), f"never a partial survival: {seen_hits}"
    assert seen_evictions == sorted(seen_evictions)


# -- 5. with chunked prefill and with preemption -----------------------------------------------------


@pytest.mark.parametrize("budget", [16, 24])
def test_tiny_hits_with_chunked_prefill(tiny, budget):
    loaded, ref, next_logits = tiny
    p, *suffixes = random_prompts([37, 20, 25, 3, 30], VOCAB, seed=61)
    engine = make_engine(loaded, block_size=16, num_kv_blocks=64, max_num_batched_tokens=budget, max_num_seqs=4)
    driver = Driver(engine)
    seed = driver.run([p], greedy(4))[0]
    prompts = [p[:n] + s for n, s in zip((37, 33, 20, 36), suffixes)]
    outs = driver.run(prompts, greedy(TINY_OUT), arrivals=[0, 0, 1, 3])
    assert [o.num_cached_tokens for o in outs][:2] == [32, 32]
    assert all(o.num_cached_tokens > 0 for o in outs)
    assert num_split_prompts(engine) > 0, "no prompt was split into chunks"
    for rec in engine.step_records:
        assert sum(n for n, _, _ in rec.chunks) <= budget
    # A chunk continuing after a hit starts at the block boundary, with the hit blocks as context.
    assert any(ctx == 32 for rec in engine.step_records for _, ctx, _ in rec.chunks)
    check_outputs(
        [p] + prompts,
        [ref(p, 4)] + [ref(x) for x in prompts],
        [seed] + outs,
        next_logits,
        f"chunked prefill, budget={budget}",
    )
    check_final_state(engine, driver)


def test_tiny_hits_with_preemption(tiny):
    loaded, ref, next_logits = tiny
    prefix, *suffixes = random_prompts([12] + [4] * 8, VOCAB, seed=71)
    prompts = [prefix + s for s in suffixes]
    # 12 blocks of 4 tokens; each request grows to 32 tokens (8 blocks, 3 of them shared).
    engine = make_engine(loaded, block_size=4, num_kv_blocks=12, max_model_len=48)
    driver = Driver(engine)
    seed = driver.run([prefix + [1]], greedy(2))[0]
    outs = driver.run(prompts, greedy(16))
    assert sum(r.num_preempted for r in engine.step_records) > 0, "the tiny pool never preempted"
    assert any(o.times.num_preemptions for o in outs)
    assert engine.block_manager.num_evictions > 0
    # Admitted at once, all hit the 3 prefix blocks the first request left; num_cached_tokens
    # reports the first admission even for preempted requests.
    assert [o.num_cached_tokens for o in outs] == [12] * len(prompts)
    check_outputs(
        [prefix + [1]] + prompts,
        [ref(prefix + [1], 2)] + [ref(p, 16) for p in prompts],
        [seed] + outs,
        next_logits,
        "preemption with prefix hits",
    )
    check_final_state(engine, driver)


def test_tiny_hits_with_preemption_staggered_and_prefill_first(tiny):
    loaded, ref, next_logits = tiny
    prefix, *suffixes = random_prompts([9] + [5] * 8, VOCAB, seed=72)
    prompts = [prefix + s for s in suffixes]
    for chunked in (True, False):
        engine = make_engine(
            loaded,
            block_size=4,
            num_kv_blocks=12,
            max_model_len=48,
            enable_chunked_prefill=chunked,
            max_num_batched_tokens=20,
            max_num_seqs=6,
        )
        driver = Driver(engine)
        outs = driver.run(prompts, greedy(16), arrivals=[0, 0, 1, 2, 3, 5, 8, 13])
        assert sum(r.num_preempted for r in engine.step_records) > 0, "the tiny pool never preempted"
        assert sum(o.num_cached_tokens for o in outs) > 0, "no request hit the shared prefix"
        check_outputs(
            prompts, [ref(p, 16) for p in prompts], outs, next_logits, f"staggered preemption, chunked={chunked}"
        )
        check_final_state(engine, driver)


@pytest.mark.real_model
def test_real_hits_with_chunked_prefill_and_preemption(default_model, real_next_logits):
    from minieng.measure.workloads import text_prompts

    tok = default_model.tokenizer
    base, *suffixes = text_prompts(tok, 40, 5)
    prompts = [base[:36] + s[:12] for s in suffixes]  # 48 tokens, 36 shared: 2 full blocks
    # 6 blocks of 16 tokens: one sequence of 96 fits, four requests of 48 + 5 do not.
    fields = dict(device="cpu", max_model_len=96, num_kv_blocks=6, max_num_batched_tokens=24, max_num_seqs=4)
    reference = LLMEngine(EngineConfig(**fields, enable_prefix_caching=False), loaded=default_model)
    refs = [o.token_ids for o in reference.generate([base] + prompts, greedy(REAL_OUT))]
    engine = LLMEngine(EngineConfig(**fields), loaded=default_model)
    driver = Driver(engine)
    outs = driver.run([base] + prompts, greedy(REAL_OUT), arrivals=[0, 3, 3, 4, 4])
    assert num_split_prompts(engine) > 0
    assert sum(r.num_preempted for r in engine.step_records) > 0, "the pool never preempted"
    assert outs[1].num_cached_tokens == 32  # base's two full blocks, computed by step 3
    check_outputs([base] + prompts, refs, outs, real_next_logits, "real, chunked prefill + preemption")
    check_final_state(engine, driver)


# -- 5b. with speculative decoding and after a reset -------------------------------------------------


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_tiny_hits_with_speculative_decoding(tiny, method):
    """Verified drafts are rolled back (``BlockManager.trim``) before full blocks are cached: the
    cache only ever holds KV of tokens the sequence kept, and later requests hit it."""
    loaded, ref, next_logits = tiny
    motif, s1, s2, s3 = random_prompts([6, 3, 5, 2], VOCAB, seed=101)
    prefix = motif * 3  # 18 tokens that repeat: prompt lookup finds drafts
    prompts = [prefix + s1, prefix + s2, prefix + s3, prefix + s1]
    # The self-draft (draft_model=None: the target's own weights) is always right under greedy.
    engine = make_engine(loaded, block_size=4, num_kv_blocks=64, speculative_method=method, num_speculative_tokens=3)
    driver = Driver(engine)
    outs = driver.run(prompts[:1], greedy(16)) + driver.run(prompts[1:], greedy(16), arrivals=[0, 1, 2])
    assert engine.spec_records and sum(acc for *_, acc in engine.spec_records) > 0, "no draft was accepted"
    assert outs[1].num_cached_tokens >= 16 and outs[3].num_cached_tokens == 20
    assert any(rows > 1 for rec in engine.step_records for _, _, rows in rec.chunks)
    check_outputs(prompts, [ref(p, 16) for p in prompts], outs, next_logits, f"speculative {method}")
    check_final_state(engine, driver)


@pytest.mark.parametrize("trigger", ["budget", "prefill_first"])
def test_tiny_draft_model_after_unverified_drafts(tiny, trigger):
    """Regression, found by the randomized test below (speculative decoding, not the prefix cache:
    it failed the same with ``enable_prefix_caching=False``; fixed in ``DraftModelDrafter._sync``,
    which now always reruns the newest token).

    The draft model computes its proposals' KV before the step is scheduled. When the step does
    not verify them (the token budget is below k + 1, so ``Scheduler._schedule_decodes`` drops
    them; or a prefill-first step admits a prompt and pauses the decodes), the target then emits
    tokens the draft already holds (a self-draft always agrees). ``DraftModelDrafter._sync`` keeps
    the draft cache's whole common prefix, i.e. every token of the sequence, so ``propose``
    schedules a 0-token chunk: alone in the batch the model raises; beside other sequences it
    reads another sequence's logits row as this one's draft."""
    loaded, ref, next_logits = tiny
    prompt, other = random_prompts([6, 9], VOCAB, seed=5)
    if trigger == "budget":
        engine = make_engine(
            loaded, speculative_method="draft", num_speculative_tokens=4, max_num_batched_tokens=4, max_num_seqs=4
        )
        outs = Driver(engine).run([prompt], greedy(6))
        prompts, refs = [prompt], [ref(prompt, 6)]
    else:
        engine = make_engine(loaded, speculative_method="draft", num_speculative_tokens=3, enable_chunked_prefill=False)
        # The second prompt arrives while the first decodes with drafts, and finishes in its prefill.
        outs = Driver(engine).run([prompt, other], [greedy(8), greedy(1)], arrivals=[0, 2])
        prompts, refs = [prompt, other], [ref(prompt, 8), ref(other, 1)]
    check_outputs(prompts, refs, outs, next_logits, f"unverified drafts ({trigger})")


def test_tiny_reset_prefix_cache_forgets_every_block(tiny):
    loaded, ref, next_logits = tiny
    p, s1, s2 = random_prompts([24, 4, 6], VOCAB, seed=111)
    engine = make_engine(loaded, block_size=4, num_kv_blocks=32, max_model_len=64)
    bm = engine.block_manager
    driver = Driver(engine)
    first = driver.run([p + s1], greedy(TINY_OUT))[0]
    assert bm.cached
    bm.reset_prefix_cache()
    assert not bm.cached and all(k is None for k in bm.block_keys)
    evictions = bm.num_evictions
    driver.exact_hits = False  # the driver's history predates the reset
    second = driver.run([p + s2], greedy(TINY_OUT))[0]
    driver.exact_hits = True
    assert second.num_cached_tokens == 0 and bm.num_evictions == evictions
    third = driver.run([p + s1], greedy(TINY_OUT))[0]
    assert third.num_cached_tokens == 24
    check_outputs(
        [p + s1, p + s2, p + s1],
        [ref(p + s1), ref(p + s2), ref(p + s1)],
        [first, second, third],
        next_logits,
        "after reset",
    )
    check_final_state(engine, driver)


# -- 6. randomized workload --------------------------------------------------------------------------

# The last one repeats a 4-token motif: equal blocks at different positions (block size 2 or 4),
# which only the parent check tells apart under a constant hash.
SHARED_PREFIXES = random_prompts([5, 8, 13], VOCAB, seed=81) + [random_prompts([4], VOCAB, seed=83)[0] * 3]
SUFFIX_POOL = random_prompts([1, 3, 4, 6], VOCAB, seed=82)

request_st = st.tuples(
    st.integers(0, len(SHARED_PREFIXES)),  # a shared prefix, or none
    st.one_of(st.integers(0, len(SUFFIX_POOL) - 1), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)),
    st.integers(1, TINY_OUT),  # max_tokens
    st.integers(0, 4),  # arrival step
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(request_st, min_size=1, max_size=8),
    block_size=st.sampled_from([2, 4]),
    spare_blocks=st.integers(0, 6),
    max_num_seqs=st.integers(1, 6),
    extra_budget=st.integers(0, 24),
    chunked=st.booleans(),
    spec=st.sampled_from([None, None, "ngram", "draft"]),
    hash_kind=st.sampled_from(["sha256", "constant"]),
)
def test_tiny_random_workload_keeps_invariants_and_outputs(
    tiny, requests, block_size, spare_blocks, max_num_seqs, extra_budget, chunked, spec, hash_kind
):
    """Random workloads, with the real hash and with a constant one (every key collides: only the
    block manager's token and parent checks stand between a request and another prefix's KV)."""
    with pytest.MonkeyPatch.context() as mp:
        if hash_kind == "constant":
            mp.setattr(bm_module, "block_hash", constant_hash)
        run_random_workload(
            tiny,
            requests,
            block_size,
            spare_blocks,
            max_num_seqs,
            extra_budget,
            chunked,
            spec,
            exact_hits=hash_kind == "sha256",
        )


def run_random_workload(
    tiny, requests, block_size, spare_blocks, max_num_seqs, extra_budget, chunked, spec, exact_hits
):
    loaded, ref, next_logits = tiny
    max_model_len = 32  # prompts <= 19 tokens, outputs <= 8
    num_blocks = max_model_len // block_size + spare_blocks
    budget = max_num_seqs + extra_budget
    engine = make_engine(
        loaded,
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        speculative_method=spec,
        num_speculative_tokens=3 if spec else 0,
    )
    prompts, params, arrivals = [], [], []
    for prefix_i, suffix, max_tokens, arrival in requests:
        prefix = SHARED_PREFIXES[prefix_i] if prefix_i < len(SHARED_PREFIXES) else []
        suffix = SUFFIX_POOL[suffix] if isinstance(suffix, int) else suffix
        prompts.append(prefix + suffix)
        params.append(greedy(max_tokens))
        arrivals.append(arrival)
    driver = Driver(engine, exact_hits=exact_hits)
    outs = driver.run(prompts, params, arrivals)
    for rec in engine.step_records:
        assert len(rec.chunks) <= max_num_seqs
    # What the example exercised (``--hypothesis-show-statistics``).
    event(f"prefix hits: {any(o.num_cached_tokens for o in outs)}")
    event(f"preempted: {any(r.num_preempted for r in engine.step_records)}")
    event(f"evicted: {engine.block_manager.num_evictions > 0}")
    event(f"drafts accepted: {sum(a for *_, a in engine.spec_records) > 0}")
    check_final_state(engine, driver)
    what = f"random workload bs={block_size} blocks={num_blocks} seqs={max_num_seqs} chunked={chunked} spec={spec}"
    check_outputs(prompts, [ref(p, sp.max_tokens) for p, sp in zip(prompts, params)], outs, next_logits, what)


# -- 6b. the block manager alone ---------------------------------------------------------------------


def seq_of(tokens, name="s", extra_keys=()) -> Sequence:
    seq = Sequence(name, list(tokens), SamplingParams(), 0.0)
    seq.extra_keys = extra_keys
    return seq


def compute(bm: BlockManager, seq: Sequence) -> None:
    """What the engine does for a whole prompt: take the hits, allocate, compute, cache."""
    hits = bm.match_prefix(seq)
    bm.take_prefix(seq, hits)
    n = seq.num_uncomputed_tokens
    bm.allocate(seq, n)
    seq.num_computed_tokens += n
    bm.cache_full_blocks(seq)


def test_keys_chain_through_the_parent():
    bs = 4
    a, b, x = [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]
    assert block_hash(b"", x) == block_hash(b"", x)
    assert block_hash(block_hash(b"", a), x) != block_hash(block_hash(b"", b), x)
    assert block_hash(b"", x) != block_hash(block_hash(b"", a), x)
    bm = BlockManager(16, bs, enable_prefix_caching=True)
    s1 = seq_of(a + x + [0])
    compute(bm, s1)
    assert len(bm.cached) == 2
    assert bm.match_prefix(seq_of(b + x + [0])) == []  # same second block, different parent: no hit
    assert bm.match_prefix(seq_of(a + b + [0])) == s1.block_table[:1]
    assert bm.match_prefix(seq_of(a + x + [0])) == s1.block_table[:2]
    assert bm.match_prefix(seq_of(a + x)) == s1.block_table[:1]  # the last token is computed
    assert s1.block_keys == chain_keys(a + x + [0], bs)


def test_extra_keys_change_the_key():
    bs = 4
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert block_hash(b"", tokens[:4]) != block_hash(b"", tokens[:4], ("lora-1",))
    assert block_hash(b"", tokens[:4], ("lora-1",)) != block_hash(b"", tokens[:4], ("lora-2",))
    bm = BlockManager(16, bs, enable_prefix_caching=True)
    base = seq_of(tokens)
    compute(bm, base)
    assert bm.match_prefix(seq_of(tokens, extra_keys=("lora-1",))) == []
    lora = seq_of(tokens, "l", extra_keys=("lora-1",))
    compute(bm, lora)
    assert lora.num_computed_tokens == 9 and not set(lora.block_table) & set(base.block_table)
    assert bm.match_prefix(seq_of(tokens, extra_keys=("lora-1",))) == lora.block_table[:2]
    assert bm.match_prefix(seq_of(tokens)) == base.block_table[:2]
    assert len(bm.cached) == 4


def test_a_colliding_key_with_other_tokens_is_refused(monkeypatch):
    bs = 4
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    bm = BlockManager(16, bs, enable_prefix_caching=True)
    seq = seq_of(tokens)
    compute(bm, seq)
    first = seq.block_table[0]
    assert bm.match_prefix(seq_of(tokens)) == seq.block_table[:2]
    # The stored token ids no longer match the key (as after a hash collision): no hit.
    stored, bm.block_tokens[first] = bm.block_tokens[first], (1, 2, 3, 99)
    assert bm.match_prefix(seq_of(tokens)) == []
    bm.block_tokens[first] = stored
    assert bm.match_prefix(seq_of(tokens)) == seq.block_table[:2]
    # Every key collides: a prompt with other tokens must still not hit.
    monkeypatch.setattr(bm_module, "block_hash", lambda parent, token_ids, extra_keys=(): b"same")
    bm = BlockManager(16, bs, enable_prefix_caching=True)
    compute(bm, seq_of(tokens))
    assert len(bm.cached) == 1
    assert bm.match_prefix(seq_of([7, 7, 7, 7, 7])) == []
    assert len(bm.match_prefix(seq_of(tokens[:4] + [0]))) == 1


def test_match_prefix_changes_nothing_and_the_cache_off_never_hits():
    tokens = list(range(1, 14))
    for enabled in (True, False):
        bm = BlockManager(8, 4, enable_prefix_caching=enabled)
        seq = seq_of(tokens)
        compute(bm, seq)
        bm.free(seq)
        state = (list(bm.ref_counts), list(bm.free_blocks), dict(bm.cached), list(bm.block_keys))
        hits = bm.match_prefix(seq_of(tokens))
        assert (list(bm.ref_counts), list(bm.free_blocks), dict(bm.cached), list(bm.block_keys)) == state
        assert len(hits) == (3 if enabled else 0)
        if not enabled:
            assert bm.cached == {} and all(k is None for k in bm.block_keys)


def test_lru_reuses_the_least_recently_freed_block_and_evicts_its_entry():
    bs = 2
    bm = BlockManager(4, bs, enable_prefix_caching=True)
    a = seq_of([1, 2, 3, 4, 5], "a")
    compute(bm, a)  # blocks 0, 1 cached (2 full blocks), block 2 holds the last token
    assert a.block_table == [0, 1, 2]
    bm.free(a)  # freed last to first: 2, 1, 0
    assert list(bm.free_blocks) == [3, 2, 1, 0]
    assert len(bm.cached) == 2 and bm.num_evictions == 0
    key0, key1 = bm.block_keys[0], bm.block_keys[1]
    c = seq_of([11, 12, 13], "c")
    bm.allocate(c, 3)  # blocks 3 and 2: neither carries a key
    assert c.block_table == [3, 2] and bm.num_evictions == 0
    d = seq_of([14], "d")
    bm.allocate(d, 1)  # block 1: a's tail, the least recently freed cached block
    assert d.block_table == [1]
    assert bm.num_evictions == 1 and key1 not in bm.cached and bm.block_keys[1] is None
    assert bm.cached == {key0: 0}
    bm.check_invariants([c, d])
    # What is left of a's prefix still hits; the evicted block does not.
    assert bm.match_prefix(seq_of([1, 2, 3, 4, 5])) == [0]
    # A hit takes block 0 off the free list; freeing it again makes it the most recently freed.
    bm.free(c)
    assert list(bm.free_blocks) == [0, 2, 3]
    e = seq_of([1, 2, 3, 4, 5], "e")
    bm.take_prefix(e, bm.match_prefix(e))
    assert e.block_table == [0] and bm.ref_counts[0] == 1 and list(bm.free_blocks) == [2, 3]
    bm.free(e)
    assert list(bm.free_blocks) == [2, 3, 0]
    bm.allocate(seq_of([0] * 4, "f"), 4)
    assert bm.num_evictions == 1 and bm.cached == {key0: 0}  # 2 and 3 carried no key
    bm.allocate(seq_of([0], "g"), 1)
    assert bm.num_evictions == 2 and bm.cached == {}


def test_a_key_computed_twice_in_one_step_has_one_entry():
    """Two sequences compute the same block in one step: the map points at the first; the other
    block carries no key, and evicting the entered block removes the entry (no stale hit)."""
    bs = 2
    bm = BlockManager(6, bs, enable_prefix_caching=True)
    a, b = seq_of([1, 2, 3], "a"), seq_of([1, 2, 4], "b")
    for s in (a, b):  # same step: neither sees the other's block before computing
        bm.allocate(s, 3)
    for s in (a, b):
        s.num_computed_tokens = 3
        bm.cache_full_blocks(s)
    assert a.block_table == [0, 1] and b.block_table == [2, 3]
    key = bm.block_keys[0]
    assert bm.cached == {key: 0} and bm.block_keys[2] is None
    bm.free(a)
    bm.free(b)
    assert list(bm.free_blocks) == [4, 5, 1, 0, 3, 2]
    assert bm.match_prefix(seq_of([1, 2, 9])) == [0]
    x = seq_of([0] * 8, "x")
    bm.allocate(x, 8)  # blocks 4, 5, 1, 0: block 0 is evicted with its entry
    assert bm.cached == {} and bm.num_evictions == 1 and bm.block_keys[0] is None
    assert bm.match_prefix(seq_of([1, 2, 9])) == []
    bm.check_invariants([x])


# -- 7. metrics -------------------------------------------------------------------------------------


def test_serving_metrics_report_cached_tokens_and_hit_rate(tiny):
    loaded, ref, next_logits = tiny
    p, s1, s2, s3 = random_prompts([20, 5, 9, 2], VOCAB, seed=91)
    prompts = [p + s1, p + s2, p + s3, p]
    engine = make_engine(loaded, block_size=4)
    driver = Driver(engine)
    outs = driver.run_each(prompts, greedy(TINY_OUT))
    assert [o.num_cached_tokens for o in outs] == [0, 20, 20, 16]
    m = serving_metrics(outs)
    assert m.cached_prompt_tokens == 56
    assert m.total_prompt_tokens == sum(len(x) for x in prompts) == 25 + 29 + 22 + 20
    assert m.prefix_cache_hit_rate == pytest.approx(56 / 96)
    check_outputs(prompts, [ref(x) for x in prompts], outs, next_logits, "metrics run")

    fresh = make_engine(loaded, block_size=4)
    distinct = random_prompts([20, 25, 9, 33], VOCAB, seed=92)
    outs = Driver(fresh).run(distinct, greedy(4))
    m = serving_metrics(outs)
    assert m.cached_prompt_tokens == 0 and m.prefix_cache_hit_rate == 0
    # The same prompts on a cache-off engine: never a hit, even sent twice.
    off = make_engine(loaded, block_size=4, enable_prefix_caching=False)
    outs = Driver(off).run_each(distinct + distinct, greedy(4))
    assert serving_metrics(outs).prefix_cache_hit_rate == 0


def test_step_records_count_evictions_cumulatively(tiny):
    loaded, ref, next_logits = tiny
    prompts = random_prompts([14] * 6, VOCAB, seed=93)
    engine = make_engine(loaded, block_size=4, num_kv_blocks=8, max_model_len=32)
    Driver(engine).run_each(prompts, greedy(4))
    counts = [r.num_evictions for r in engine.step_records]
    assert counts == sorted(counts) and counts[-1] == engine.block_manager.num_evictions > 0

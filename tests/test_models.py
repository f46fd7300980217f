"""Policy networks: shapes and dtypes, the precision policy (float32 parameters, compute in the
chosen dtype, float32 outputs), separate vs shared trunks, gradients reaching every parameter,
network selection by observation shape, and the parameter groups.

Shape and dtype checks use `jax.eval_shape` / `jax.make_jaxpr` (trace only, no compile); the
numeric checks share one compiled init + gradients function per configuration."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import actions as A
from terra_rl.features.global_maps import map_channels, map_input, pool_tiles
from terra_rl.nets.models import (
    ExcavationPolicy,
    GymnaxCNNPolicy,
    GymnaxMLPPolicy,
    PatchConv,
    PolicyConfig,
    make_policy,
    uses_convolutions,
    with_derived_features,
)
from terra_rl.nets.parameters import count_parameters, parameter_groups
from terra_rl.validation import references, small

NUM_ACTIONS = A.NUM_ACTIONS
SMALL = {"hidden_dim": 32, "map_feature_dim": 32}
ARCHITECTURES = [
    ("atari", False),
    ("atari", True),
    ("resnet", False),
    ("resnet", True),
    ("flat", False),
]
# Each gradient configuration costs one compile: together they cover both encoders, both
# trunk layouts and both precisions.
GRADIENT_CASES = [
    ("atari", False, "float32"),
    ("resnet", True, "float32"),
    ("atari", True, "bfloat16"),
    ("resnet", False, "bfloat16"),
    ("flat", True, "float32"),
]


def _case_id(case):
    map_encoder, separate, precision = case
    return f"{map_encoder}-{'separate' if separate else 'shared'}-{precision}"


@pytest.fixture(scope="module")
def obs4(batch16):
    """Real reset observations of 4 envs (2 tracked, 2 wheeled), with a loaded bucket, a
    turned wheel and a cabin heading, a few last actions."""
    obs = small.varied_observations()
    assert list(obs["agent_type"]) == [A.TRACKED, A.TRACKED, A.WHEELED, A.WHEELED]
    return obs


def _model(map_encoder="atari", separate=False, precision="float32"):
    config = PolicyConfig(
        map_encoder=map_encoder,
        separate_actor_critic_trunks=separate,
        precision=precision,
        **SMALL,
    )
    return ExcavationPolicy(config, NUM_ACTIONS)


def _abstract_params(model, obs):
    return jax.eval_shape(model.init, jax.random.PRNGKey(0), obs)["params"]


_GRADIENTS = {}


def _gradients(case, obs):
    """params and the gradients of three losses for one configuration (memoised)."""
    if case not in _GRADIENTS:
        init_and_gradients = functools.partial(references.init_and_gradients, _model(*case))
        _GRADIENTS[case] = jax.jit(init_and_gradients)(jax.random.PRNGKey(0), obs)
    return _GRADIENTS[case]


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs",
    [{"map_encoder": "vit"}, {"precision": "float64"}, {"hidden_dim": 0}, {"map_feature_dim": -1},
     {"image_encoder": "vit"}, {"map_pool": 0}],
)
def test_policy_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PolicyConfig(**kwargs)


# --------------------------------------------------------------------------- shapes, dtypes


def test_map_channels_mark_the_agent_and_the_layers(obs4):
    channels = np.asarray(map_channels(obs4))
    assert channels.shape == (4, 16, 16, 7) and channels.dtype == np.float32
    for env in range(4):
        row, col = obs4["agent_state"][env, :2]
        position = channels[env, :, :, 6]
        assert position.sum() == 1 and position[row, col] == 1
    np.testing.assert_array_equal(channels[..., 0], obs4["target_map"] == -1)
    np.testing.assert_array_equal(channels[..., 1], obs4["target_map"] == 1)
    np.testing.assert_array_equal(channels[..., 4], obs4["obstacles"] == 1)


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(("map_encoder", "separate"), ARCHITECTURES)
def test_outputs_are_float32_and_params_float32(obs4, map_encoder, separate, precision):
    model = _model(map_encoder, separate, precision)
    params = _abstract_params(model, obs4)
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    logits, value = jax.eval_shape(model.apply, {"params": params}, obs4)
    assert (logits.shape, logits.dtype) == ((4, NUM_ACTIONS), jnp.float32)
    assert (value.shape, value.dtype) == ((4,), jnp.float32)


def test_extra_leading_batch_dims(obs4):
    model = _model("resnet")
    obs = jax.tree.map(lambda x: x.reshape(2, 2, *x.shape[1:]), obs4)
    logits, value = jax.eval_shape(model.apply, {"params": _abstract_params(model, obs4)}, obs)
    assert logits.shape == (2, 2, NUM_ACTIONS) and value.shape == (2, 2)


def _matmul_operand_dtypes(jaxpr, found):
    """Operand dtypes of every dot_general / conv in a jaxpr and its sub-jaxprs."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            found.append((eqn.primitive.name, tuple(v.aval.dtype for v in eqn.invars)))
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _matmul_operand_dtypes(inner, found)
    return found


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("map_encoder", ["atari", "resnet"])
def test_matmuls_and_convs_run_in_the_compute_dtype(obs4, map_encoder, precision):
    model = _model(map_encoder, False, precision)
    params = _abstract_params(model, obs4)
    jaxpr = jax.make_jaxpr(model.apply)({"params": params}, obs4).jaxpr
    ops = _matmul_operand_dtypes(jaxpr, [])
    names = {name for name, _ in ops}
    assert names == {"dot_general", "conv_general_dilated"}
    # trunk 2 + heads 2 + map Dense 1 + agent MLP 2 + local MLP 2
    assert sum(name == "dot_general" for name, _ in ops) == 9
    assert_heads_float32_rest_in(ops, precision)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_flat_encoder_has_no_convolution(obs4, precision):
    model = _model("flat", False, precision)
    assert not uses_convolutions(model) and uses_convolutions(_model("atari"))
    params = _abstract_params(model, obs4)
    assert params["encoder"]["map_encoder"]["Dense_0"]["kernel"].shape == (16 * 16 * 8, 32)
    jaxpr = jax.make_jaxpr(model.apply)({"params": params}, obs4).jaxpr
    ops = _matmul_operand_dtypes(jaxpr, [])
    assert {name for name, _ in ops} == {"dot_general"}
    assert len(ops) == 9
    assert_heads_float32_rest_in(ops, precision)


def test_map_pool_averages_blocks_of_tiles(obs4):
    maps = jnp.arange(2 * 3 * 4 * 4, dtype=jnp.float32).reshape(2, 3, 4, 4)
    pooled = np.asarray(pool_tiles(maps, 2))
    assert pooled.shape == (2, 3, 2, 2) and pooled.dtype == np.float32
    np.testing.assert_allclose(pooled[1, 2, 0, 1], np.asarray(maps[1, 2, 0:2, 2:4]).mean())
    assert pool_tiles(maps, 1) is maps
    with pytest.raises(ValueError, match="must divide the map size"):
        pool_tiles(maps, 3)
    model = ExcavationPolicy(PolicyConfig(map_encoder="flat", map_pool=2, **SMALL), NUM_ACTIONS)
    params = _abstract_params(model, obs4)
    assert params["encoder"]["map_encoder"]["Dense_0"]["kernel"].shape == (8 * 8 * 8, 32)


@pytest.mark.parametrize("factor", [2, 4])
def test_pooled_layers_equal_the_pooled_channels_bit_for_bit(obs4, factor):
    """The map input pools each layer apart (`pooled_map_layers`): the same bits as pooling the
    stacked channels with a mean over reshaped block axes, log1p layers included."""
    rng = np.random.default_rng(factor)
    obs = dict(obs4, action_map=jnp.asarray(rng.integers(-3, 4, obs4["action_map"].shape),
                                            obs4["action_map"].dtype))
    channels = map_channels(obs)
    batch, size, _, depth = channels.shape
    blocks = channels.reshape(batch, size // factor, factor, size // factor, factor, depth)
    expected = np.asarray(blocks.mean(axis=(2, 4)))
    got = np.asarray(map_input(obs, factor))
    assert got.shape == (batch, size // factor, size // factor, 8) and got.dtype == np.float32
    np.testing.assert_array_equal(got[..., :depth].view(np.uint32), expected.view(np.uint32))
    assert not got[..., depth:].any()
    assert np.any((expected[..., 2] % 1) != 0)  # the log1p layer is not whole numbers


def assert_heads_float32_rest_in(ops, precision: str) -> None:
    """The two head matmuls (the last two) take float32; every other matmul and conv takes
    the compute dtype: nothing silently promoted, nothing left in half precision."""
    *encoder, policy_head, value_head = ops
    assert [policy_head, value_head] == [("dot_general", (jnp.dtype(jnp.float32),) * 2)] * 2
    wrong = [(name, dtypes) for name, dtypes in encoder if set(dtypes) != {jnp.dtype(precision)}]
    assert not wrong


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=_case_id)
def test_every_parameter_gets_a_finite_nonzero_gradient(obs4, case):
    params, grads = _gradients(tuple(case), obs4)
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    assert references.gradient_problems(grads["total"]) == []


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=_case_id)
def test_trunks_share_parameters_only_when_shared(obs4, case):
    """Separate trunks share no parameter; a shared trunk receives both losses (the check is
    the model-separate-trunks validation gate's, here over both encoders and precisions)."""
    params, grads = _gradients(tuple(case), obs4)
    separate = case[1]
    assert ("encoder" not in params) == separate
    assert references.trunk_sharing_problems(params, grads["policy"], grads["value"]) == []


# --------------------------------------------------------------------------- gymnax, factory


@pytest.mark.parametrize(
    ("obs_shape", "expected_cls"),
    [((4, 4), GymnaxMLPPolicy), ((4, 10, 10, 4), GymnaxCNNPolicy)],
)
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_gymnax_networks_selected_by_obs_shape(obs_shape, expected_cls, precision):
    obs = jnp.zeros(obs_shape, jnp.float32)
    model = make_policy(PolicyConfig(precision=precision), 3, obs)
    assert type(model) is expected_cls
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), obs)["params"]
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    logits, value = jax.eval_shape(model.apply, {"params": params}, obs)
    assert (logits.shape, logits.dtype) == ((4, 3), jnp.float32)
    assert (value.shape, value.dtype) == ((4,), jnp.float32)
    ops = _matmul_operand_dtypes(jax.make_jaxpr(model.apply)({"params": params}, obs).jaxpr, [])
    assert len(ops) > 2
    assert_heads_float32_rest_in(ops, precision)


def test_gymnax_mlp_actor_and_critic_are_separate():
    obs = jax.random.normal(jax.random.PRNGKey(0), (4, 4))
    model = GymnaxMLPPolicy(2)

    @jax.jit
    def init_and_value_grads(key):
        params = model.init(key, obs)["params"]
        return params, jax.grad(lambda p: model.apply({"params": p}, obs)[1].sum())(params)

    params, value_grads = init_and_value_grads(jax.random.PRNGKey(1))
    assert set(params) == {"actor_encoder", "critic_encoder", "policy_head", "value_head"}
    assert count_parameters(params) == 2 * (4 * 64 + 64 + 64 * 64 + 64) + (64 * 2 + 2) + 65
    assert not any(np.asarray(g).any() for g in jax.tree.leaves(value_grads["actor_encoder"]))
    assert all(np.asarray(g).any() for g in jax.tree.leaves(value_grads["critic_encoder"]))


def test_image_observations_get_a_flat_mlp_with_image_encoder_mlp():
    """MinAtar-shaped obs [B, 10, 10, 4]: `image_encoder="mlp"` gives the MLP over the
    flattened image (no convolution, so no unrolled loops on CPU); its outputs equal the
    vector MLP's on the same numbers flattened by hand."""
    obs = jax.random.uniform(jax.random.PRNGKey(0), (3, 2, 10, 10, 4))
    model = make_policy(PolicyConfig(image_encoder="mlp"), 5, obs[0])
    assert type(model) is GymnaxMLPPolicy and model.flatten_image
    assert not uses_convolutions(model)
    assert uses_convolutions(make_policy(PolicyConfig(map_encoder="flat"), 5, obs[0]))
    params = model.init(jax.random.PRNGKey(1), obs[0])["params"]
    assert count_parameters(params) == 2 * (400 * 64 + 64 + 64 * 64 + 64) + (64 * 5 + 5) + 65
    logits, value = model.apply({"params": params}, obs)  # two leading batch dims
    assert logits.shape == (3, 2, 5) and value.shape == (3, 2)
    flat_logits, flat_value = GymnaxMLPPolicy(5).apply({"params": params},
                                                       obs.reshape(3, 2, 400))
    np.testing.assert_array_equal(logits, flat_logits)
    np.testing.assert_array_equal(value, flat_value)


def test_gymnax_activation_relu_changes_the_hidden_layers_only():
    """`gymnax_activation="relu"`: the same parameters as tanh; the hidden layers are relu
    (the network equals a hand-written relu MLP), so the outputs differ from tanh's."""
    obs = jax.random.normal(jax.random.PRNGKey(0), (6, 4))
    relu = make_policy(PolicyConfig(gymnax_activation="relu"), 3, obs)
    tanh = make_policy(PolicyConfig(), 3, obs)
    assert relu.activation == "relu" and tanh.activation == "tanh"
    params = relu.init(jax.random.PRNGKey(1), obs)["params"]
    assert jax.tree.structure(params) == jax.tree.structure(
        tanh.init(jax.random.PRNGKey(1), obs)["params"])
    logits, value = relu.apply({"params": params}, obs)

    def mlp(name, x):
        for layer in ("Dense_0", "Dense_1"):
            x = np.maximum(x @ params[name][layer]["kernel"] + params[name][layer]["bias"], 0)
        return x

    head = params["policy_head"]
    np.testing.assert_allclose(logits, mlp("actor_encoder", obs) @ head["kernel"] + head["bias"],
                               rtol=1e-5, atol=1e-5)
    head = params["value_head"]
    np.testing.assert_allclose(value, (mlp("critic_encoder", obs) @ head["kernel"]
                                       + head["bias"])[:, 0], rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits, tanh.apply({"params": params}, obs)[0])
    with pytest.raises(ValueError, match="gymnax_activation must be one of"):
        PolicyConfig(gymnax_activation="gelu")


def test_gymnax_hidden_dim_sets_every_hidden_width():
    """`gymnax_hidden_dim` widens both layers of both MLPs and the CNN's Dense; the heads
    keep their shapes, and 64 stays the default."""
    vector = jnp.zeros((2, 4))
    image = jnp.zeros((2, 10, 10, 3))
    for width, expected in ((None, 64), (256, 256)):
        config = PolicyConfig() if width is None else PolicyConfig(gymnax_hidden_dim=width)
        mlp = make_policy(config, 3, vector).init(jax.random.PRNGKey(0), vector)["params"]
        for trunk in ("actor_encoder", "critic_encoder"):
            assert mlp[trunk]["Dense_0"]["kernel"].shape == (4, expected)
            assert mlp[trunk]["Dense_1"]["kernel"].shape == (expected, expected)
        assert mlp["policy_head"]["kernel"].shape == (expected, 3)
        cnn = make_policy(config, 3, image).init(jax.random.PRNGKey(0), image)["params"]
        dense = [leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(cnn)
                 if "Dense" in jax.tree_util.keystr(path) and leaf.ndim == 2]
        assert dense and all(shape[1] == expected for shape in dense)
    with pytest.raises(ValueError, match="gymnax_hidden_dim must be >= 1"):
        PolicyConfig(gymnax_hidden_dim=0)


def test_make_policy_picks_the_excavation_policy(obs4):
    config = PolicyConfig(map_encoder="resnet")
    model = make_policy(config, NUM_ACTIONS, obs4)
    assert type(model) is ExcavationPolicy
    assert model.config == config and model.num_actions == NUM_ACTIONS


def test_stored_derived_features_give_the_same_outputs(obs4):
    """The rollout stores the parameter-free features with its observations
    (`with_derived_features`) and the update's gradient passes read them: the outputs must be
    those of the network computing them itself, and the network must read the stored ones."""
    config = PolicyConfig(map_encoder="flat", compass=True, dig_distance=True,
                          egocentric_radius=2, **SMALL)
    model = ExcavationPolicy(config, NUM_ACTIONS)
    derived = jax.jit(functools.partial(with_derived_features, model))(obs4)
    added = {key: derived[key].shape for key in set(derived) - set(obs4)}
    size = obs4["target_map"].shape[-1]  # the flat encoder's input: stored on CPU, as here
    assert added == {"compass": (4, 240), "dig_distance": (4, 38),
                     "egocentric_view": (4, 5, 5, 4), "map_input": (4, size, size, 8)}
    assert all(derived[key].dtype == jnp.float32 for key in added)
    variables = jax.jit(model.init)(jax.random.PRNGKey(0), obs4)
    apply = jax.jit(model.apply)
    logits, value = apply(variables, obs4)
    stored_logits, stored_value = apply(variables, derived)
    np.testing.assert_array_equal(stored_logits, logits)
    np.testing.assert_array_equal(stored_value, value)
    for key in added:  # a changed stored feature changes the outputs: it is read, not redone
        changed = dict(derived, **{key: derived[key] + 1.0})
        assert not np.allclose(apply(variables, changed)[0], logits), key
    assert with_derived_features(GymnaxMLPPolicy(3), obs4["agent_state"]) is obs4["agent_state"]
    # A convolutional encoder's map input is recomputed in each pass, never stored.
    cnn = ExcavationPolicy(dataclasses.replace(config, map_encoder="atari"), NUM_ACTIONS)
    assert "map_input" not in jax.eval_shape(functools.partial(with_derived_features, cnn), obs4)


@pytest.mark.parametrize(
    "example_obs",
    [
        jnp.zeros((4,)),
        jnp.zeros((4, 3, 3)),
        jnp.zeros((4, 2, 3, 3, 3)),
        {"observation": jnp.zeros((4, 3))},
    ],
    ids=["per-env-scalar", "per-env-2d", "per-env-4d", "unknown-dict"],
)
def test_make_policy_rejects_unsupported_observations(example_obs):
    with pytest.raises(ValueError, match="observation"):
        make_policy(PolicyConfig(), 3, example_obs)


# --------------------------------------------------------------------------- parameter groups


@pytest.mark.parametrize(("map_encoder", "separate"), ARCHITECTURES)
def test_parameter_groups_partition_the_params(obs4, map_encoder, separate):
    variables = jax.eval_shape(_model(map_encoder, separate).init, jax.random.PRNGKey(0), obs4)
    groups = parameter_groups(variables)
    assert set(groups) == {"policy_head", "value_head", "encoder"}
    assert parameter_groups(variables["params"]).keys() == groups.keys()
    total = count_parameters(variables)
    assert sum(count_parameters(group) for group in groups.values()) == total
    assert count_parameters(groups["policy_head"]) == 32 * NUM_ACTIONS + NUM_ACTIONS
    assert count_parameters(groups["value_head"]) == 32 + 1
    expected_encoders = {"actor_encoder", "critic_encoder"} if separate else {"encoder"}
    assert set(groups["encoder"]) == expected_encoders
    paths = [set(references.leaf_paths(group)) for group in groups.values()]
    assert sum(len(p) for p in paths) == len(jax.tree.leaves(variables))


def test_parameter_groups_of_gymnax_networks():
    for model, obs in (
        (GymnaxMLPPolicy(2), jnp.zeros((1, 4))),
        (GymnaxCNNPolicy(3), jnp.zeros((1, 10, 10, 4))),
    ):
        params = jax.eval_shape(model.init, jax.random.PRNGKey(0), obs)["params"]
        groups = parameter_groups(params)
        assert sum(map(count_parameters, groups.values())) == count_parameters(params)
    with pytest.raises(ValueError, match="policy_head"):
        parameter_groups({"encoder": {}})


# --------------------------------------------------------------------------- PatchConv


@pytest.mark.parametrize("map_encoder", ["atari", "resnet", "gymnax_cnn"])
def test_patch_convolutions_match_lax_convolutions(obs4, map_encoder):
    """`conv_as_matmul` keeps the parameter tree and the initial values, and gives the same
    logits, values and gradients (to float32 rounding) as `lax.conv`; it also tells the
    update that the loops need no unrolling."""
    if map_encoder == "gymnax_cnn":
        obs = jax.random.uniform(jax.random.PRNGKey(2), (4, 10, 10, 4))
        make = lambda matmul: make_policy(  # noqa: E731
            PolicyConfig(conv_as_matmul=matmul), 3, obs)
    else:
        obs = obs4
        make = lambda matmul: ExcavationPolicy(  # noqa: E731
            PolicyConfig(map_encoder=map_encoder, conv_as_matmul=matmul, **SMALL), NUM_ACTIONS)
    lax_model, patch_model = make(False), make(True)
    assert uses_convolutions(lax_model) and not uses_convolutions(patch_model)
    # Each model's init, outputs and gradient compile as one program: run op by op, their
    # hundreds of small compiles took most of this test's time.
    params = jax.jit(lax_model.init)(jax.random.PRNGKey(0), obs)
    patch_params = jax.jit(patch_model.init)(jax.random.PRNGKey(0), obs)
    assert jax.tree.structure(params) == jax.tree.structure(patch_params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                    jax.tree.leaves(patch_params), strict=True))

    def outputs_and_gradient(model, p):
        def loss(p):
            logits, value = model.apply(p, obs)
            return jnp.sum(jax.nn.log_softmax(logits)[:, 0]) + jnp.sum(value ** 2)

        return jax.jit(lambda p: (model.apply(p, obs), jax.grad(loss)(p)))(p)

    for a, b in zip(jax.tree.leaves(outputs_and_gradient(lax_model, params)),
                    jax.tree.leaves(outputs_and_gradient(patch_model, params)), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize(("height", "width", "kernel", "stride"),
                         [(10, 10, 8, 4), (9, 7, 4, 2), (5, 6, 3, 1), (16, 16, 3, 2)])
def test_patch_conv_equals_nn_conv_on_odd_shapes(height, width, kernel, stride):
    """SAME padding splits unevenly on these shapes; the result must still be nn.Conv's."""
    x = jax.random.normal(jax.random.PRNGKey(3), (2, height, width, 3))
    conv = nn.Conv(5, (kernel, kernel), strides=(stride, stride), padding="SAME")
    params = conv.init(jax.random.PRNGKey(4), x)
    expected = conv.apply(params, x)
    got = PatchConv(5, kernel, stride).apply(params, x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)

"""The name of the pmapped device axis: the update's gradient mean, the evaluation and every
metric reduce over it (`jax.lax.pmean`, `psum`, `pmax`)."""

AXIS = "device"

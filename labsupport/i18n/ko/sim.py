"""Korean messages of ``labsupport.sim`` (frame captions of the engine's timeline)."""

MESSAGES = {
    "step {n}": "스텝 {n}",
}

"""One module per phase. Each handler looks once and returns the phase to run next in the
same look (it transitioned and the next phase should act now), or None (this look is done).

No handler calls another: only ``engine.machine`` dispatches and chains them, with a bound.
"""

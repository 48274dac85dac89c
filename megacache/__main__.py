from .interfaces.cli import run

run()

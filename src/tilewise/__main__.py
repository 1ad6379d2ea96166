from .cli import run

if __name__ == "__main__":  # `python -m tilewise`; importing the module (documentation tools do) runs nothing
    raise SystemExit(run())

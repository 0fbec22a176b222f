"""What tests/test_distributed.py starts with torchrun: edgettt's command line, where KILL=RANK:STEP makes rank RANK
end abruptly (os._exit) right after the checkpoint of step STEP is written, as a killed process would."""

import os

from edgettt import resume
from edgettt.cli import main

if os.environ.get("KILL"):
    rank, at = map(int, os.environ["KILL"].split(":"))
    save = resume.Checkpoints.save

    def save_then_die(self, step, *args):
        save(self, step, *args)
        if step == at and int(os.environ["RANK"]) == rank:
            os._exit(9)

    resume.Checkpoints.save = save_then_die

main()

"""The oracle's solve.sh reads its own files at /solution/..., as Harbor uploads solution/ to /solution.

Published TB2 tasks do (headless-terminal: `cp /solution/headless_terminal.py /app/`); the private copy the
oracle runs from must hold them at the path the rewritten script names.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from environments.terminal_tasks.harbor import load_harbor_task
from environments.terminal_tasks.verify import solution_script

TB2 = Path(__file__).parent / "fixtures" / "tb2" / "count-errors"


def test_solve_sh_finds_its_files_under_slash_solution(tmp_path: Path) -> None:
    task_dir = tmp_path / "task"
    shutil.copytree(TB2, task_dir)
    (task_dir / "solution" / "helper.py").write_text("print('from the solution dir')\n")
    (task_dir / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nset -e\ncp /solution/helper.py /app/helper.py\nbash -c 'cat /solution/helper.py' > /app/seen.txt\n"
    )
    task = load_harbor_task(task_dir)
    work = tmp_path / "work"
    work.mkdir()
    ran = subprocess.run(["bash", "-c", solution_script(task, str(work))], capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
    assert (work / "helper.py").read_text() == "print('from the solution dir')\n"
    assert (work / "seen.txt").read_text() == "print('from the solution dir')\n"

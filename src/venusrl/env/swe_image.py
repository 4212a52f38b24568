"""`swe-image`: SWE-bench-style tasks whose repository lives in a container image.

Each row names an image (imported with `venusrl sandbox image import`), the repository's
path inside it (`repo`), the task text (`prompt`) and the command that runs its tests
(`test_command`), as SWE-bench and
SWE-Gym images are used: the trajectory's sandbox starts from the image (one template per
image, so a group's sandboxes share its layers and node), the model works with `bash`,
`read_file` and `write_file`, and the reward is 1 when the test command exits 0 in the
sandbox as the episode left it. `generate_dataset` builds such rows (and their images)
from swe-lite's generated repositories, so the path is tested without a network.
"""

from __future__ import annotations

from typing import Any

from venusrl.env.base import Environment, Episode
from venusrl.env.swe_lite import TOOLS, RepositoryTools, emit_images
from venusrl.env.swe_lite import generate_dataset as generate_repositories
from venusrl.sandbox.image.store import DEFAULT_STORE
from venusrl.sandbox.image.templates import image_template
from venusrl.sandbox.template import Template

TEST_OUTPUT_CHARS = 4000


def generate_dataset(count: int, seed: int = 0, image_store: str = DEFAULT_STORE) -> list[dict[str, Any]]:
    """swe-lite's repositories as images in `image_store`, and one row per image."""
    return emit_images(generate_repositories(count, seed), image_store)


class SweImageEnv(RepositoryTools, Environment):
    needs_sandbox = True
    required_fields = ("image", "repo", "prompt", "test_command")

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self.sandbox: Any = None
        self.test_command = ""
        self.test_output = ""  # the last test run's output, for logs and inspection

    def sandbox_template(self, row: dict[str, Any]) -> Template:
        self.check_row(row)
        return image_template(row["image"])

    async def reset(self, row: dict[str, Any], sandbox: Any = None):
        self.check_row(row)
        if sandbox is None:
            raise ValueError("the swe-image environment needs a sandbox (an AsyncSandbox)")
        self.sandbox, self.repo, self.test_command = sandbox, row["repo"], row["test_command"]
        listing = await sandbox.run("git ls-files 2>/dev/null || find . -type f -not -path '*/.*' | sort | head -200",
                                    timeout=self.timeout_s, cwd=self.repo)
        messages = [{"role": "system", "content": f"You fix bugs in the repository at {self.repo}. "
                                                  f"Its tests run with `{self.test_command}`."},
                    {"role": "user", "content": f"{row['prompt']}\nFiles:\n{listing.stdout}"}]
        return messages, TOOLS

    async def reward(self, episode: Episode) -> float:
        """1 when the row's test command passes in the sandbox as the episode left it."""
        result = await self.sandbox.run(self.test_command, timeout=self.timeout_s, cwd=self.repo)
        self.test_output = (result.stdout + result.stderr)[-TEST_OUTPUT_CHARS:]
        return float(result.exit_code == 0 and not result.timed_out)

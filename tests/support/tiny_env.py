"""The shortest useful environment: write a word into a file. If this grows, the API got worse."""

from __future__ import annotations

from atroposlib.envs.base import APIServerConfig

from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig
from tests.support.embedded import embedded_tokenizer


class WriteWordEnv(HermesAgentBaseEnv):
    name = "write_word"
    default_toolsets = ["file"]
    default_system_prompt = "Use the tools to do what the user asks."

    @classmethod
    def config_init(cls):
        return HermesAgentEnvConfig(tokenizer_name=embedded_tokenizer(), use_wandb=False), [
            APIServerConfig(base_url="http://127.0.0.1:1/v1", model_name="scripted")
        ]

    async def setup(self):
        self.words = ["apple", "river", "stone"]
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return {"word": self.words[(self.i - 1) % len(self.words)]}

    def format_prompt(self, item):
        return f"Write the word {item['word']} into answer.txt"

    async def compute_reward(self, item, result, ctx):
        try:
            return 1.0 if (await ctx.read_file("answer.txt")).strip() == item["word"] else 0.0
        except FileNotFoundError:
            return 0.0

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":  # the CLI tests run this env as a command
    WriteWordEnv.cli()

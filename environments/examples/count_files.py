"""The template for a new env: how many files are in your workspace?

python -m environments.examples.count_files process --env.total_steps 2 --env.group_size 2
"""

from environments.hermes_base_env import HermesAgentBaseEnv


class CountFilesEnv(HermesAgentBaseEnv):
    name = "count_files"
    default_toolsets = ["terminal"]

    async def items(self):
        return list(range(1, 10))  # an item is the number of files to create

    def format_prompt(self, item):
        return "How many files are in your workspace? Answer with the number only."

    async def setup_trajectory_workspace(self, item, ctx):
        for i in range(item):
            await ctx.write_file(f"file{i}.txt", "")

    async def compute_reward(self, item, result, ctx):
        return 1.0 if (result.final_response or "").strip() == str(item) else 0.0


if __name__ == "__main__":
    CountFilesEnv.cli()

using System;
using System.Collections.Generic;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Tests
{
    /// <summary>
    /// NPC memory from C#: seed a scope, search it, a turn that reads it is told the memory (the final's
    /// MemoriesUsed), list and forget; bad input is INVALID_ARGUMENT and changes nothing. The daemon
    /// serves the tiny random llama: what it answers is never looked at.
    /// </summary>
    public static class MemoryTests
    {
        public static void Register()
        {
            TestRunner.Add("an_npc_recalls_what_the_game_seeded", SeededRecall);
        }

        static async Task SeededRecall()
        {
            using (var client = Env.Client(Env.Token))
            {
                var scope = "village-" + Guid.NewGuid().ToString("N");
                var made = await client.RememberAsync(scope, new[] { "The old mill burned down last winter.", "The baker's name is Odo." },
                    new[] { "lore" });
                Check.Equal(2, made.Count, "one memory per text");
                Check.Equal("game", made[0].Source, "the game's own memory");
                var found = await client.RecallAsync("who bakes the bread?", new[] { scope }, 1);
                Check.Equal(made[1].Id, found[0].Memory.Id, "the closest memory is the baker's");
                Check.True(found[0].Score > 0.2f, "a related memory scores: " + found[0].Score);

                var npc = new NpcConversation(client, "miller-" + Guid.NewGuid().ToString("N"), "You are the miller.")
                {
                    MaxTokens = 4, Sampling = await NoEarlyEnd.Ban(client),
                    Memory = new MemoryOptions { ReadScopes = new List<string> { scope }, MaxTokens = 100 },
                };
                var reply = await npc.SayAsync("What happened to the old mill?");
                Check.True(reply.Final.MemoriesUsed.Contains(made[0].Id), "the turn was told the mill's memory");
                await npc.EndAsync();

                var page = await client.ListMemoriesAsync(scope);
                Check.Equal(2u, page.Value, "two memories in the scope");
                var e = await Check.Throws<SidecarException>(() => client.RememberAsync(scope, new[] { "" }), "an empty memory");
                Check.Equal(SidecarStatusCode.InvalidArgument, e.Code, "an empty memory is INVALID_ARGUMENT");
                Check.Equal(2u, (await client.ListMemoriesAsync(scope)).Value, "the refused call changed nothing");
                Check.Equal(1u, await client.ForgetAsync(ids: new[] { made[0].Id }), "forgotten by id");
                Check.Equal(1u, await client.ForgetAsync(scope: scope), "the rest of the scope");
            }
        }
    }
}

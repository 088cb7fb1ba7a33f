using System;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Tests
{
    /// <summary>
    /// Save games through NpcConversation: SaveAsync with and without the KV cache, the session ended
    /// (as a daemon restart leaves it), LoadAsync from bytes and from base64, and a damaged save
    /// refused with nothing changed. pytest's own tests restart the daemon in between
    /// (tests/transports/test_session_saves.py); here the daemon is shared.
    /// </summary>
    public static class SaveTests
    {
        public static void Register()
        {
            TestRunner.Add("an_npc_saves_and_loads_its_conversation", SaveAndLoad);
        }

        static async Task SaveAndLoad()
        {
            using (var client = Env.Client(Env.Token))
            {
                var id = "saved-" + Guid.NewGuid().ToString("N");
                var npc = new NpcConversation(client, id, "You are Hild, a shepherd.") { MaxTokens = 6, Sampling = await NoEarlyEnd.Ban(client) };
                Check.True(await npc.SaveAsync() == null, "an NPC never spoken to has nothing to save");
                var first = await npc.SayAsync("Seen my goat?");
                var withKv = await npc.SaveAsync(includeKv: true);
                var textOnly = await npc.SaveBase64Async();
                var textBytes = Convert.FromBase64String(textOnly).Length;
                Check.True(withKv.Length > 4 * textBytes, "the KV cache makes the save larger: " + withKv.Length + " bytes against " + textBytes);
                await npc.EndAsync();

                var loaded = new NpcConversation(client, id, "You are Hild, a shepherd.") { MaxTokens = 6, Sampling = npc.Sampling };
                var info = await loaded.LoadAsync(withKv);
                Check.Equal("kv", info.Restored, "restored from its KV cache");
                var next = await loaded.SayAsync("It is black.");
                Check.True(next.Usage.PromptTokens > first.Usage.PromptTokens + first.Usage.CompletionTokens,
                    "the next turn holds the saved one (" + next.Usage.PromptTokens + " tokens)");
                Check.True(next.Usage.CachedPromptTokens >= first.Usage.PromptTokens,
                    "the saved KV cache was used: " + next.Usage.CachedPromptTokens + " cached");

                info = await loaded.LoadAsync(textOnly);
                Check.Equal("text", info.Restored, "a text-only save rebuilds from its text");
                var damaged = (byte[])withKv.Clone();
                damaged[damaged.Length / 2] ^= 1;
                var e = await Check.Throws<SidecarException>(() => loaded.LoadAsync(damaged), "a damaged save");
                Check.Equal(SidecarStatusCode.InvalidArgument, e.Code, "a damaged save is INVALID_ARGUMENT");
                var again = await loaded.SayAsync("Thanks.");
                Check.True(again.Usage.PromptTokens > next.Usage.PromptTokens - 10, "the refused load changed nothing");
                await loaded.EndAsync();
            }
        }
    }
}

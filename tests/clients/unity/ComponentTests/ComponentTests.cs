using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using UnityEngine;
using UnityEngine.SceneManagement;
using Xlm.Sidecar.Unity;
using Debug = UnityEngine.Debug;
using Object = UnityEngine.Object;
using Stopwatch = System.Diagnostics.Stopwatch;

namespace Xlm.Sidecar.Tests
{
    /// <summary>
    /// The Unity components against a live daemon, hosted by the UnityEngine stand-in (not Unity: it
    /// runs their Awake/OnEnable/OnDestroy and UnityEvents, the daemon and the client are real).
    /// Screen capture needs a GPU and is only compiled.
    /// </summary>
    public static class ComponentTests
    {
        public static int Main(string[] args)
        {
            TestRunner.Add("npc_dialogue_streams_into_ui_text", NpcDialogueStreams);
            TestRunner.Add("npc_dialogue_cancel_and_a_new_line_cancels_the_old", NpcDialogueCancel);
            TestRunner.Add("vram_budget_follows_quality_and_scene", VramBudgetFollows);
            TestRunner.Add("launcher_launches_and_stops_with_the_game_object", LauncherLifetime);
            TestRunner.Add("launcher_reports_frames_once_a_second", LauncherReportsFrames);
            return TestRunner.Run(args);
        }

        static SidecarLauncher Attached()
        {
            return new GameObject("Sidecar").AddComponentForTests<SidecarLauncher>(l =>
            {
                l.AttachAddress = Env.WebSocketAddress;
                l.AttachToken = Env.Token;
            });
        }

        static async Task NpcDialogueStreams()
        {
            var launcher = Attached();
            var npc = new GameObject("Brom").AddComponentForTests<NpcDialogue>(n =>
            {
                n.Launcher = launcher;
                n.NpcId = "brom-" + Guid.NewGuid().ToString("N");
                n.SystemPrompt = "You are Brom.";
                n.MaxTokens = 12;
                n.Temperature = 0;
            });
            npc.LogitBias = (await NoEarlyEnd.Ban(await launcher.WhenReady)).LogitBias;
            var shown = new List<string>();
            string finished = null;
            npc.OnTextChanged.AddListener(t => shown.Add(t));
            npc.OnReplyFinished.AddListener(t => finished = t);
            var offMainThread = 0;
            npc.PieceReceived += piece => { if (!MainThread.IsCurrent) offMainThread++; };

            var reply = await npc.SayAsync("Greetings, smith.");
            Check.Equal(12u, reply.Usage.CompletionTokens, "completion tokens");
            Check.True(shown.Count >= 2 && shown[0] == "", "the text is cleared, then grows: " + shown.Count + " updates");
            Check.Equal(reply.Text, shown[shown.Count - 1], "the UI ends with the whole reply");
            Check.Equal(reply.Text, npc.CurrentText, "CurrentText");
            Check.Equal(reply.Text, finished, "onReplyFinished got the reply");
            Check.Equal(0, offMainThread, "pieces delivered off the main thread");
            var second = await npc.SayAsync("Can you mend my sword?");
            Check.True(second.Usage.CachedPromptTokens >= reply.Usage.PromptTokens, "the NPC's session is reused");
            Object.Destroy(npc.gameObject);
            Object.Destroy(launcher.gameObject);
            Check.Equal(0, Debug.Errors.Count, "errors logged: " + string.Join("\n", Debug.Errors));
        }

        static async Task NpcDialogueCancel()
        {
            var launcher = Attached();
            var npc = new GameObject("Guard").AddComponentForTests<NpcDialogue>(n =>
            {
                n.Launcher = launcher;
                n.NpcId = "guard-" + Guid.NewGuid().ToString("N");
                n.SystemPrompt = "You are Brom.";
                n.MaxTokens = 2000;
                n.Temperature = 0;
            });
            // Run to max tokens whatever the machine, so the reply is surely running when it is cancelled.
            npc.LogitBias = (await NoEarlyEnd.Ban(await launcher.WhenReady)).LogitBias;
            var pieces = 0;
            npc.PieceReceived += piece => { if (++pieces == 1) npc.Cancel(); };
            await Check.Throws<OperationCanceledException>(() => npc.SayAsync("Tell me a story"), "Cancel() during the reply");
            Check.True(!npc.IsReplying, "not replying after the cancel");

            // A new line while the NPC answers cancels that answer and takes its place.
            pieces = 0;
            Action<string> once = null;
            Task<GenerationResult> interrupted = null;
            Task<GenerationResult> replacement = null;
            once = piece =>
            {
                npc.PieceReceived -= once;
                npc.MaxTokens = 5;
                replacement = npc.SayAsync("Never mind.");
            };
            npc.PieceReceived += once;
            interrupted = npc.SayAsync("Tell me a story");
            await Check.Throws<OperationCanceledException>(() => interrupted, "the interrupted answer");
            var clock = Stopwatch.StartNew();
            while (replacement == null && clock.Elapsed < TimeSpan.FromSeconds(5))
                await Task.Delay(10);
            var result = await replacement;
            Check.Equal(5u, result.Usage.CompletionTokens, "the new line's answer");
            Object.Destroy(npc.gameObject);
            Object.Destroy(launcher.gameObject);
            Check.Equal(0, Debug.Errors.Count, "errors logged: " + string.Join("\n", Debug.Errors));
        }

        static async Task VramBudgetFollows()
        {
            var launcher = Attached();
            var applied = new List<ulong>();
            var budget = new GameObject("Budget").AddComponentForTests<VramBudget>(b =>
            {
                b.Launcher = launcher;
                b.DefaultVram = "512M";
                b.ByQualityLevel.Add(new VramBudget.Entry { name = "Ultra", vram = "256M" });
                b.ByScene.Add(new VramBudget.Entry { name = "Boss", vram = "0" });
                b.BudgetApplied += r => applied.Add(r.Budget.VramBytes);
            });
            await WaitFor(() => applied.Count >= 1, "the budget applied on enable");
            Check.Equal(512UL << 20, applied[applied.Count - 1], "the default budget at start");

            QualitySettings.SetQualityLevel(3, true); // "Ultra"
            budget.RunFrameForTests();
            await WaitFor(() => applied.Contains(256UL << 20), "the budget after the quality change");

            SceneManager.LoadSceneForTests("Boss");
            await WaitFor(() => applied[applied.Count - 1] == 0, "the boss scene's budget");
            var status = await launcher.Client.GetStatusAsync();
            Check.Equal(0UL, status.Budget.VramBytes, "the daemon is on the scene's budget");

            SceneManager.LoadSceneForTests("Main");
            QualitySettings.SetQualityLevel(0, true);
            budget.RunFrameForTests();
            await WaitFor(() => budget.Applied != null && budget.Applied.Budget.VramBytes == 512UL << 20, "back to the default");
            Object.Destroy(budget.gameObject);
            Object.Destroy(launcher.gameObject);
            Check.Equal(0, Debug.Errors.Count, "errors logged: " + string.Join("\n", Debug.Errors));
        }

        static async Task LauncherLifetime()
        {
            var launcher = new GameObject("Sidecar").AddComponentForTests<SidecarLauncher>(l =>
            {
                l.ExecutablePath = Env.Get("XLM_TEST_SIDECAR_EXE");
                l.ModelPath = Env.Get("XLM_TEST_MODEL");
                l.Budget = "0";
                l.ExtraArguments = new[] { "--threads", "1", "--profile", "off" };
            });
            var client = await launcher.WhenReady;
            Check.True(launcher.IsReady && launcher.Process != null, "launched by Awake");
            var status = await client.GetStatusAsync();
            Check.Equal(EnginePhase.Ready, status.Phase, "the launched daemon answers");
            var process = launcher.Process;
            Object.Destroy(launcher.gameObject); // OnDestroy stops the daemon
            Check.True(process.HasExited, "the daemon is gone once the component is");
            Check.Equal(0, await process.Exit, "a clean exit");
            Check.Equal(0, Debug.Errors.Count, "errors logged: " + string.Join("\n", Debug.Errors));
        }

        static async Task LauncherReportsFrames()
        {
            var launcher = Attached();
            await launcher.WhenReady;
            Check.True(launcher.ReportFrames, "frame reports are on by default");
            Time.SetUnscaledDeltaTimeForTests(0.0125f); // exact in binary: 80 frames are 1000 ms
            var clock = Stopwatch.StartNew();
            for (var frame = 0; frame < 79; frame++)
                launcher.RunFrameForTests();
            Check.True(clock.ElapsedMilliseconds < 500, "Update never waits for the daemon: " + clock.ElapsedMilliseconds + " ms");
            var reporter = launcher.FrameReporter;
            Check.True(reporter != null, "Update made the reporter once connected");
            Check.True(Math.Abs(reporter.FrameBudgetMs - 1000.0 / 60) < 1e-9, "no target frame rate: a 60 fps budget");
            Check.True(launcher.FrameGuard == null && reporter.Answered == 0, "79 frames of 12.5 ms: under a second, nothing sent");
            launcher.RunFrameForTests();
            await reporter.Pending;
            Check.Equal(1, reporter.Answered, "the 80th frame completes a second and its report is answered");
            Check.True(launcher.FrameGuard != null && launcher.FrameGuard.Reports >= 1, "the guard's answer: " +
                (launcher.FrameGuard == null ? "none" : launcher.FrameGuard.Source));

            Application.targetFrameRate = 30;
            launcher.RunFrameForTests();
            Check.True(Math.Abs(reporter.FrameBudgetMs - 1000.0 / 30) < 1e-9, "the budget follows Application.targetFrameRate");
            Application.targetFrameRate = -1;

            launcher.ReportFrames = false;
            for (var frame = 0; frame < 200; frame++)
                launcher.RunFrameForTests();
            await reporter.Pending;
            Check.Equal(1, reporter.Answered, "turned off: no more reports");
            Object.Destroy(launcher.gameObject);
            Check.True(launcher.FrameReporter == null, "the reporter goes with the connection");
            Check.Equal(0, Debug.Errors.Count, "errors logged: " + string.Join("\n", Debug.Errors));
        }

        static async Task WaitFor(Func<bool> condition, string what)
        {
            var clock = Stopwatch.StartNew();
            while (!condition())
            {
                if (clock.Elapsed > TimeSpan.FromSeconds(15))
                    throw new AssertionFailed("timed out waiting for " + what);
                await Task.Delay(10);
            }
        }
    }
}

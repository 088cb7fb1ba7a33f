using System;
using System.Collections.Generic;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Tests
{
    /// <summary>
    /// Frame reports: FrameStats' figures and the mapping offline; ReportFrames, the status's
    /// frame_guard and FrameReporter's once-a-window sending against a live daemon over the transport
    /// under test. The live reports are of clean frames (under budget), so the daemon's guard is not
    /// made to slow down the other tests sharing it.
    /// </summary>
    public static class FrameTests
    {
        public static void Register()
        {
            TestRunner.Add("frame_stats_give_percentiles_and_reset", Stats);
            TestRunner.Add("frame_reports_map_to_protobuf_json", Mapping);
            TestRunner.Add("frame_reports_reach_the_guard", ReportFrames);
            TestRunner.Add("frame_reporter_sends_once_a_window_off_the_main_thread", Reporter);
        }

        /// <summary>`--frame-report`: reads {"frames": [ms...], "windowMs": w, "budgetMs": b} on stdin,
        /// makes the report with FrameStats and prints {"request": its JSON mapping, "grpc": its
        /// protobuf bytes in base64, or null without the gRPC codec}. pytest checks both with Python's
        /// protobuf (test_unity_client.py).</summary>
        public static int ReportTool()
        {
            var input = Json.ParseObject(Console.In.ReadToEnd());
            var stats = new FrameStats();
            foreach (var ms in input.GetArray("frames"))
                stats.Add((double)ms);
            var request = stats.TakeReport(input.GetDouble("windowMs"), input.GetDouble("budgetMs")).ToJson();
            Console.WriteLine(Json.Write(new JsonObject
            {
                { "request", request },
                { "grpc", Transports.EncodeOrNull("xlm.v1.FrameReport", request) },
            }));
            return 0;
        }

        static bool Near(double expected, double actual)
        {
            return Math.Abs(expected - actual) < 1e-9;
        }

        static Task Stats()
        {
            var stats = new FrameStats();
            Check.True(stats.TakeReport(1000, 16) == null, "no report without frames");
            var shuffled = new List<double>();
            for (var ms = 1; ms <= 100; ms++)
                shuffled.Add(ms);
            var random = new Random(7);
            for (var i = shuffled.Count - 1; i > 0; i--)
            {
                var j = random.Next(i + 1);
                var t = shuffled[i];
                shuffled[i] = shuffled[j];
                shuffled[j] = t;
            }
            foreach (var ms in shuffled)
                stats.Add(ms, ms / 2);
            stats.Add(double.NaN);
            stats.Add(-1);
            Check.Equal(100, stats.Count, "NaN and negative times are ignored");
            Check.True(Near(5050, stats.TotalMs), "the frames' total: " + stats.TotalMs);
            var report = stats.TakeReport(0, 16.5);
            Check.Equal(100u, report.Frames, "frames");
            Check.True(Near(5050, report.WindowMs), "no window given: the frames' total");
            Check.True(Near(50, report.FrameMsP50), "the median (nearest rank): " + report.FrameMsP50);
            Check.True(Near(99, report.FrameMsP99), "the 99th percentile (nearest rank): " + report.FrameMsP99);
            Check.True(Near(100, report.FrameMsMax), "the longest frame");
            Check.Equal(84u, report.FramesOverBudget, "frames of 17 to 100 ms are over 16.5");
            Check.True(Near(16.5, report.FrameBudgetMs), "the budget goes with the report");
            Check.True(Near(49.5, report.GpuFrameMsP99), "the GPU's 99th percentile: " + report.GpuFrameMsP99);
            Check.Equal(0, stats.Count, "a report starts a new window");
            Check.True(Near(0, stats.TotalMs), "and its total");
            Check.True(stats.TakeReport(1000, 16.5) == null, "nothing left after a report");

            stats.Add(16);
            var one = stats.TakeReport(1000, 0);
            Check.True(Near(16, one.FrameMsP50) && Near(16, one.FrameMsP99) && Near(16, one.FrameMsMax), "one frame is every percentile");
            Check.True(Near(1000, one.WindowMs), "a window given is the window sent");
            Check.Equal(0u, one.FramesOverBudget, "budget 0 (the daemon's): nothing counted here");
            Check.True(Near(0, one.GpuFrameMsP99), "no GPU times: 0, not measured");

            stats.Add(10);
            stats.Add(90000);
            var hitch = stats.TakeReport(0, 16.7);
            Check.True(Near(FrameStats.MaxMs, hitch.FrameMsMax), "a frame over a minute counts as one: " + hitch.FrameMsMax);
            Check.True(Near(FrameStats.MaxMs, hitch.WindowMs), "a window at most a minute long: " + hitch.WindowMs);
            Check.Equal(1u, hitch.FramesOverBudget, "the hitch is over budget");

            stats.Add(5);
            stats.Add(20);
            stats.Reset();
            Check.Equal(0, stats.Count, "Reset forgets the window");

            Check.True(Near(1000.0 / 60, FrameStats.BudgetForFrameRate(-1)), "no target frame rate: 60 fps");
            Check.True(Near(1000.0 / 60, FrameStats.BudgetForFrameRate(0)), "0: 60 fps");
            Check.True(Near(1000.0 / 30, FrameStats.BudgetForFrameRate(30)), "30 fps");
            Check.True(Near(1, FrameStats.BudgetForFrameRate(5000)), "at least 1 ms (the daemon's least)");
            Check.True(Near(1000, FrameStats.BudgetForFrameRate(0.5)), "at most 1000 ms");
            return Task.FromResult(0);
        }

        static Task Mapping()
        {
            var report = new FrameReport
            {
                Frames = 60, WindowMs = 1000.5, FrameMsP50 = 16.5, FrameMsP99 = 33.25, FrameMsMax = 40,
                FramesOverBudget = 3, FrameBudgetMs = 16.75, GpuFrameMsP99 = 0,
            };
            Check.Equal("{\"frames\":60,\"windowMs\":1000.5,\"frameMsP50\":16.5,\"frameMsP99\":33.25,\"frameMsMax\":40," +
                        "\"framesOverBudget\":3,\"frameBudgetMs\":16.75,\"gpuFrameMsP99\":0}",
                Json.Write(report.ToJson()), "FrameReport in the JSON mapping");

            const string guard = "{\"enabled\":true,\"source\":\"frame reports\",\"frameBudgetMs\":16.7,\"maxThreads\":2," +
                                 "\"maxPassTokens\":64,\"pauseMs\":1.5,\"lowPriority\":true,\"idleClass\":true,\"reason\":\"frames run late\"," +
                                 "\"gameFrameMsP99\":30.5,\"gameOverBudgetShare\":0.25,\"gameBusyCores\":1.5,\"gameBusyThreads\":2," +
                                 "\"changes\":\"18446744073709551615\",\"reports\":\"7\"}";
            var state = FrameGuardState.FromJson(Json.ParseObject(guard));
            Check.True(state.Enabled && state.LowPriority && state.IdleClass, "booleans");
            Check.Equal("frame reports", state.Source, "source");
            Check.Equal("frames run late", state.Reason, "reason");
            Check.Equal(2u, state.MaxThreads, "maxThreads");
            Check.Equal(64u, state.MaxPassTokens, "maxPassTokens");
            Check.Equal(2u, state.GameBusyThreads, "gameBusyThreads");
            Check.True(Near(16.7, state.FrameBudgetMs) && Near(1.5, state.PauseMs) && Near(30.5, state.GameFrameMsP99) &&
                       Near(0.25, state.GameOverBudgetShare) && Near(1.5, state.GameBusyCores), "the doubles");
            Check.Equal(ulong.MaxValue, state.Changes, "uint64 changes, as a string");
            Check.Equal(7UL, state.Reports, "uint64 reports");

            var status = Status.FromJson(Json.ParseObject("{\"version\":\"1\",\"frameGuard\":" + guard + "}"));
            Check.True(status.FrameGuard != null && status.FrameGuard.Source == "frame reports", "Status.frame_guard");
            Check.Equal(7UL, status.FrameGuard.Reports, "the status's guard reports");
            var older = Status.FromJson(Json.ParseObject("{\"version\":\"1\"}"));
            Check.True(older.FrameGuard != null && !older.FrameGuard.Enabled && older.FrameGuard.Reports == 0,
                "a status without frame_guard reads as its defaults");

            Check.Equal("{\"vramSize\":\"2G\",\"maxCpuThreads\":3,\"ramSize\":\"512M\"}",
                Json.Write(SetBudgetRequest.Vram("2G", 3, "512M").ToJson()), "SetBudgetRequest with ram_size");
            Check.Equal("{\"ramSize\":\"0\"}", Json.Write(SetBudgetRequest.Ram("0").ToJson()), "only the RAM budget");
            Check.True(!SetBudgetRequest.Vram("1G").ToJson().ContainsKey("ramSize"), "no ram_size unless given");
            var budget = Status.FromJson(Json.ParseObject("{\"version\":\"1\",\"budget\":{\"vramBytes\":\"0\",\"ramBytes\":\"536870912\"}}")).Budget;
            Check.Equal(536870912UL, budget.RamBytes, "Budget.ram_bytes, the RAM budget in force");
            return Task.FromResult(0);
        }

        /// <summary>60 clean frames (well under a 60 fps budget) over a second.</summary>
        static FrameReport Clean()
        {
            var stats = new FrameStats();
            for (var i = 0; i < 60; i++)
                stats.Add(8 + (i % 4));
            return stats.TakeReport(1000, FrameStats.BudgetForFrameRate(60));
        }

        static async Task ReportFrames()
        {
            using (var client = Env.Client(Env.Token))
            {
                var state = await client.ReportFramesAsync(Clean());
                Check.True(state.Reports >= 1, "the report is counted: " + state.Reports);
                Check.True(!string.IsNullOrEmpty(state.Source), "the guard says what it goes by");
                if (state.Enabled)
                {
                    Check.Equal("frame reports", state.Source, "the guard goes by the reports it gets");
                    Check.True(Near(11, state.GameFrameMsP99), "it saw the game's 99th percentile: " + state.GameFrameMsP99);
                    Check.True(Near(1000.0 / 60, state.FrameBudgetMs), "the game's budget: " + state.FrameBudgetMs);
                    Check.True(Near(0, state.GameOverBudgetShare), "no frame over budget");
                }
                var status = await client.GetStatusAsync();
                Check.True(status.FrameGuard != null && status.FrameGuard.Reports >= state.Reports,
                    "the status has the guard too: " + (status.FrameGuard == null ? "none" : status.FrameGuard.Reports.ToString()));

                var impossible = Clean();
                impossible.FrameMsP50 = impossible.FrameMsMax + 1;
                var e = await Check.Throws<SidecarException>(() => client.ReportFramesAsync(impossible), "p50 over the max");
                Check.Equal(SidecarStatusCode.InvalidArgument, e.Code, e.Message);
                var empty = Clean();
                empty.Frames = 0;
                e = await Check.Throws<SidecarException>(() => client.ReportFramesAsync(empty), "no frames");
                Check.Equal(SidecarStatusCode.InvalidArgument, e.Code, e.Message);
            }
        }

        static async Task Reporter()
        {
            using (var client = Env.Client(Env.Token))
            {
                var reporter = new FrameReporter(client) { IntervalS = 0.5, FrameBudgetMs = FrameStats.BudgetForFrameRate(60) };
                var logged = new List<string>();
                reporter.Log = logged.Add;
                var onMainThread = 0;
                var answers = 0;
                reporter.Reported += s =>
                {
                    answers++;
                    if (MainThread.IsCurrent) onMainThread++;
                };
                var sent = 0;
                for (var frame = 0; frame < 40; frame++)
                    if (reporter.AddFrame(10))
                        sent++;
                Check.Equal(0, sent, "400 ms of frames: not a window of 500 yet");
                for (var frame = 0; frame < 10; frame++)
                    if (reporter.AddFrame(10))
                        sent++;
                Check.Equal(1, sent, "the 50th frame of 10 ms completes the window");
                await reporter.Pending;
                await client.Dispatcher.FlushAsync();
                Check.True(logged.Count == 0, "no failure: " + string.Join("; ", logged));
                Check.Equal(1, reporter.Answered, "the daemon answered");
                Check.True(reporter.Guard != null && reporter.Guard.Reports >= 1, "the guard's answer is kept");
                Check.Equal(1, answers, "Reported once");
                Check.Equal(1, onMainThread, "Reported on the main thread");

                reporter.Enabled = false;
                for (var frame = 0; frame < 100; frame++)
                    Check.True(!reporter.AddFrame(10), "off: nothing sent");
                reporter.Enabled = true;
                reporter.IntervalS = 0;
                Check.True(Near(FrameReporter.MinIntervalS, reporter.IntervalS), "at most 10 reports a second");
            }

            // No daemon: the failure is told once, never thrown, and the reports go on.
            using (var client = new SidecarClient(Env.Unreachable(Env.Token), null))
            {
                var logged = new List<string>();
                var reporter = new FrameReporter(client) { IntervalS = 0.1, Log = logged.Add };
                for (var window = 0; window < 3; window++)
                {
                    for (var frame = 0; frame < 20; frame++)
                        reporter.AddFrame(10);
                    await reporter.Pending;
                }
                Check.Equal(1, logged.Count, "one failure told for three: " + string.Join("; ", logged));
                Check.True(logged[0].Contains("UNAVAILABLE"), "it says why: " + logged[0]);
                Check.True(!reporter.Stopped, "an unreachable daemon does not stop the reports");
                Check.Equal(0, reporter.Answered, "nothing answered");
            }
        }
    }
}

//! What the tools tell a client beyond their answers: the cap on
//! background tasks.

use serde_json::json;

use crate::support::{answer, text, Served};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_tasks_past_the_cap_are_a_tool_error_the_model_reads_and_a_finished_one_frees_a_place() {
    let served = Served::start(&["--max-background-tasks", "2"]).await;
    let background = |n: u32| json!({"description": format!("task {n}"), "prompt": "[slow] wait", "run_in_background": true});
    let first = answer(&served.call("subagent", background(1)).await);
    answer(&served.call("subagent", background(2)).await);
    let refused = served.call("subagent", background(3)).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert_eq!(
        text(&refused),
        "background task refused: this session already has 2 running (the most at once); \
         collect one with task_output or stop one with task_kill, or run this one in the foreground"
    );
    let task_id = first["task_id"].as_str().unwrap();
    assert_eq!(answer(&served.call("task_kill", json!({"task_id": task_id})).await)["outcome"], "requested");
    let killed = answer(&served.call("task_output", json!({"task_id": task_id, "timeout_ms": 20000})).await);
    assert_eq!(killed["status"], "killed", "{killed}");
    assert_eq!(answer(&served.call("subagent", background(4)).await)["kind"], "background");
    assert!(served.close().await.0.success());
}

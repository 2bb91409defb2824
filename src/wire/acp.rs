//! ACP's side of what both ends agree on: the stop reasons of a turn, for
//! the `acp` provider (the client) and `subagents acp` (the agent). The
//! messages themselves are the official crate's.

use agent_client_protocol::v1::schema::StopReason as AcpStop;

use crate::seam::StopReason;

/// Our stop reasons and ACP's, for both ends: this client and the agent in
/// `subagents acp`. `Error` has none: a failed turn is an error answer, and an
/// ACP reason not listed (`max_turn_requests`, …) is an error to us.
const STOP_REASONS: [(StopReason, AcpStop); 4] = [
    (StopReason::Completed, AcpStop::EndTurn),
    (StopReason::MaxTokens, AcpStop::MaxTokens),
    (StopReason::Refusal, AcpStop::Refusal),
    (StopReason::Aborted, AcpStop::Cancelled),
];

pub(crate) fn stop_reason_of(acp: AcpStop) -> StopReason {
    STOP_REASONS.iter().find(|(_, theirs)| *theirs == acp).map_or(StopReason::Error, |(ours, _)| *ours)
}

#[cfg(any(feature = "agent", test))]
pub(crate) fn acp_stop_of(stop: StopReason) -> Option<AcpStop> {
    STOP_REASONS.iter().find(|(ours, _)| *ours == stop).map(|(_, theirs)| *theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_map_both_ways_and_error_is_an_error_answer_not_a_reason() {
        for stop in [StopReason::Completed, StopReason::MaxTokens, StopReason::Refusal, StopReason::Aborted] {
            let acp = acp_stop_of(stop).expect("every outcome but Error has an ACP reason");
            assert_eq!(stop_reason_of(acp), stop);
        }
        assert_eq!(acp_stop_of(StopReason::Error), None);
        assert_eq!(stop_reason_of(AcpStop::MaxTurnRequests), StopReason::Error);
    }
}

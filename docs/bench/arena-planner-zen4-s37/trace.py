"""Trace the hybrid planner's decisions per step (s37)."""
import sys, time, json
from augury import planner as P
from augury.engine import Engine
log = open(sys.argv[1], "w")
orig_plan, orig_obs_step, orig_obs_draft = P.Planner.plan, P.Planner.observe_step, P.Planner.observe_draft
def plan(self, requests):
    ks = orig_plan(self, requests)
    r = requests[0]
    c = self.costs
    odds = self.tally.odds()
    log.write(json.dumps(dict(ev="plan", step=self.steps, out=len(r.seq.output), ks=ks, started=r.started,
        t1=round(c.target_time(1,1)*1e3,1), t5=round(c.target_time(1,1+self.k_max)*1e3,1),
        dr=round(c.draft_round_time(1)*1e3,1), cu=round(c.catch_up_per_token*1e3,2), alpha=round(self.alpha,3),
        ralpha=round(self._alpha(r),3), acc=[round(a,2) for a in odds.accept], reach=[round(a,2) for a in odds.reach],
        left=round(self._tokens_left(r),1), behind=r.catch_up(), probes=self.probes, pk=self.planned_k))+"\n")
    return ks
def observe_step(self, report, requests):
    r = requests[0]
    res = report.results[0]
    log.write(json.dumps(dict(ev="step", w=report.width, s=round(report.seconds*1e3,1), dr=res.num_drafted if res else None,
        acc=res.num_accepted if res else None, bucket=r.draft.bucket if len(r.draft) else None))+"\n")
    return orig_obs_step(self, report, requests)
def observe_draft(self, requests, ks, m):
    log.write(json.dumps(dict(ev="draft", rows=m.rows, rounds=m.rounds, s=round(m.seconds*1e3,1), start_tok=m.started_tokens, start_s=round(m.start_s*1e3,1), fw=m.forwards, len=len(requests[0].draft), bucket=requests[0].draft.bucket))+"\n")
    return orig_obs_draft(self, requests, ks, m)
P.Planner.plan, P.Planner.observe_step, P.Planner.observe_draft = plan, observe_step, observe_draft
orig_gen = Engine.generate
def generate(self, prompt_ids, params, on_text=None):
    log.write(json.dumps(dict(ev="request", prompt=len(prompt_ids), proposer=type(self.proposer).__name__))+"\n"); log.flush()
    out = orig_gen(self, prompt_ids, params, on_text)
    log.write(json.dumps(dict(ev="done", tokens=len(out.token_ids), s=round(out.stats.total_s,3)))+"\n"); log.flush()
    return out
Engine.generate = generate
from augury.cli import main
sys.exit(main(sys.argv[2:]))

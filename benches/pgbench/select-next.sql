-- select-next: the same read with fence_next on it (one component call, no write).
\set id 1 + :client_id + :nclients * random(0, :rows / :nclients - 1)
\set n :n + 1
\set fence :base + :n
SELECT fence_next(fence_state, report_id, '0.' || :fence, 'strict', NULL, NULL) FROM ext_catalog WHERE report_id = 'report/' || :id;

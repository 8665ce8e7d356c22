-- select-base: read the state and build the token text, no component call
-- (the baseline of select-next).
\set id 1 + :client_id + :nclients * random(0, :rows / :nclients - 1)
\set n :n + 1
\set fence :base + :n
SELECT fence_state, '0.' || :fence FROM ext_catalog WHERE report_id = 'report/' || :id;

-- plain: the seed's conditional UPDATE (no extension). Variables: see run.
\set id 1 + :client_id + :nclients * random(0, :rows / :nclients - 1)
\set n :n + 1
\set fence :base + :n
UPDATE plain_catalog SET visible_object = 'objects/' || :fence, accepted_fence = :fence WHERE report_id = 'report/' || :id AND accepted_fence < :fence;
